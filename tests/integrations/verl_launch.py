"""The overrides of examples/verl/run_trace_qwen3.sh, as `python -m verl.trainer.main_ppo` receives them (shared by
the verl tests; reads the script's text only, imports nothing from verl)."""

import re
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "verl" / "run_trace_qwen3.sh"


def launch_overrides(train="train.parquet", val="val.parquet", model="Qwen/Qwen3-4B", here="/x") -> list[str]:
    body = SCRIPT.read_text().split("python -m verl.trainer.main_ppo \\\n", 1)[1].split('"$@"')[0]
    subst = {"$TRAIN_FILES": train, "$VAL_FILES": val, "$MODEL": model, "$HERE": here, '"': ""}
    overrides = []
    for line in body.splitlines():
        line = re.sub(r"\$\(basename [^)]*\)", Path(model).name, line.strip().rstrip("\\").strip())
        for k, v in subst.items():
            line = line.replace(k, v)
        if line:
            overrides.append(line.replace("'", ""))
    return overrides


def with_overrides(overrides: list[str], **changes: str) -> list[str]:
    """`overrides` with the value of each key in `changes` replaced (a key given with dots, as in the script);
    keys the script does not set are added with Hydra's `+` only when verl's config lacks them (`+` in the key)."""
    out, seen = [], set()
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("+")
        if key in changes:
            seen.add(key)
            item = f"{item.split('=', 1)[0]}={changes[key]}"
        out.append(item)
    out += [f"{k}={v}" for k, v in changes.items() if k.lstrip("+") not in seen]
    return out
