"""The overrides of examples/verl/run_trace_qwen3.sh, as `python -m verl.trainer.main_ppo` receives them (shared by
the verl tests; reads the script's text only, imports nothing from verl)."""

import re
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "verl" / "run_trace_qwen3.sh"


def launch_overrides(
    train="train.parquet", val="val.parquet", model="Qwen/Qwen3-4B", here="/x", num_cpus="32", storage_units="1"
) -> list[str]:
    """The overrides, with the script's variables as given (Ray's CPUs and TransferQueue's storage units at what
    the script picks on a machine with fewer than 16 CPUs)."""
    body = SCRIPT.read_text().split("python -m verl.trainer.main_ppo \\\n", 1)[1].split('"$@"')[0]
    subst = {
        "$TRAIN_FILES": train,
        "$VAL_FILES": val,
        "$MODEL": model,
        "$HERE": here,
        "$RAY_NUM_CPUS": num_cpus,
        "$TQ_STORAGE_UNITS": storage_units,
        '"': "",
    }
    overrides = []
    for line in body.splitlines():
        line = re.sub(r"\$\(basename [^)]*\)", Path(model).name, line.strip().rstrip("\\").strip())
        for k, v in subst.items():
            line = line.replace(k, v)
        if line:
            overrides.append(line.replace("'", ""))
    return overrides


def with_overrides(overrides: list[str], **changes: str) -> list[str]:
    """`overrides` with the value of each key in `changes` replaced (keys with dots, as in the script; a key
    written with Hydra's `+` matches the script's `+key` too); keys the script does not set are appended as given
    (with `+` for a key verl's config lacks)."""
    wanted = {k.lstrip("+"): (k, v) for k, v in changes.items()}
    out, seen = [], set()
    for item in overrides:
        written, _, value = item.partition("=")
        key = written.lstrip("+")
        if key in wanted:
            seen.add(key)
            value = wanted[key][1]
        out.append(f"{written}={value}")
    out += [f"{k}={v}" for key, (k, v) in wanted.items() if key not in seen]
    return out
