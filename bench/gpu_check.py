"""The first GPU run in one command: the CUDA kernel checks, two training steps in float32 and in bfloat16 with a
checkpoint and a resume, and (with --backend vllm) the vLLM engine's checks; one table, also written as JSON.

    bash bench/gpu_check.sh                                   # one CUDA GPU, the shipped tiny warm start, < 8 min
    bash bench/gpu_check.sh --model /models/Qwen2.5-0.5B-Instruct --json runs/gpu_check/qwen.json
    python bench/gpu_check.py --device cpu --model random-tiny    # the dry mode: every check's code on CPU

Before any work it refuses, in one line (exit 2): a torch without CUDA or one that sees no GPU (`--device cuda`),
a model that is not here (`tiny` resolves through `lm.models.resolve_model_path`: the warm start is never built
here), and python packages trace-rl needs that are missing, unless their wheels lie in $GPU_CHECK_WHEELS (default
bench/wheels; installed into a temporary folder, no network: WHEELS below lists them and how to fetch them).
Parts (each row: the check, pass/fail, the measured figure, its tolerance, seconds):
1. kernels (bench/gpu_check_kernels.py): flex attention against the dense mask, forward and backward; the packed
   update's gradients against the flat update's; the HF backend's KV branching against recomputation; each in
   float32 and bfloat16;
2. train (bench/gpu_check_train.py), per dtype: `trace-rl train` one step with a checkpoint, resumed for a second:
   sampler/update log-prob agreement (k3 KL and clip fraction), finite KLs, the checkpoint written and resumed;
   figures: generation and update tokens/s, peak GPU memory;
3. vllm (bench/gpu_check_vllm.py, only with --backend vllm, which then also trains on vLLM): one TRACE step through
   the engine, its log-probs against HF, weight sync, the HF backend's step against it.
A part that raises is one failed row with the error, and the rest still runs. Exit 1 on any failed row.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# what trace-rl's train path imports beyond torch and transformers; a bare GPU image lacks omegaconf, whose 2.4.0
# wheel is pure python and needs only PyYAML (its grammar's parser is vendored). Fetched where pip reaches PyPI:
#   pip download --no-deps --only-binary=:all: -d bench/wheels omegaconf==2.4.0
WHEELS = {"omegaconf": "omegaconf==2.4.0"}
NEEDED = ("numpy", "yaml", "transformers", "tokenizers", "safetensors", *WHEELS)
DTYPES = ("float32", "bfloat16")


class Refusal(Exception):
    """What stops the check before any work: one line."""


def preflight(device: str) -> dict:
    """torch's build and the device, before anything else loads: the versions, or one line (Refusal)."""
    if importlib.util.find_spec("torch") is None:
        raise Refusal(f"torch is not installed in {sys.executable}")
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    if device == "cuda":
        if torch.version.cuda is None:
            raise Refusal(
                f"torch {torch.__version__} in {sys.executable} is a CPU-only build (torch.version.cuda is None): "
                "run with a CUDA build of torch (PYTHON=/path/to/python), or --device cpu for the dry mode"
            )
        if not torch.cuda.is_available():
            raise Refusal(
                f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU (torch.cuda.is_available() is "
                "False): check the driver and CUDA_VISIBLE_DEVICES"
            )
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1))
    return info


def ensure_packages(wheels_dir: Path) -> list[str]:
    """The packages in NEEDED that import; missing ones installed from `wheels_dir` (pip --no-index into a temporary
    folder put on sys.path and PYTHONPATH); returns what was installed, or one line (Refusal) naming what is missing."""
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if not missing:
        return []
    wheels = sorted(wheels_dir.glob("*.whl")) if wheels_dir.is_dir() else []
    carried = [w for w in wheels if any(w.name.lower().startswith(WHEELS[m].split("==")[0].replace("-", "_"))
                                        for m in missing if m in WHEELS)]  # fmt: skip
    if not carried or any(m not in WHEELS for m in missing):
        need = ", ".join(WHEELS.get(m, m) for m in missing)
        raise Refusal(
            f"{sys.executable} lacks {need}; put their wheels in {wheels_dir} (see WHEELS in bench/gpu_check.py) "
            "or set GPU_CHECK_WHEELS"
        )
    target = tempfile.mkdtemp(prefix="gpu-check-site-")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", target]
    res = subprocess.run([*cmd, *map(str, carried)], capture_output=True, text=True)
    if res.returncode != 0:
        raise Refusal(f"installing {', '.join(w.name for w in carried)} failed: {res.stderr.strip()[-300:]}")
    sys.path.insert(0, target)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [target, os.environ.get("PYTHONPATH")]))
    importlib.invalidate_caches()
    still = [m for m in missing if importlib.util.find_spec(m) is None]
    if still:
        raise Refusal(f"still missing after installing the carried wheels: {', '.join(still)}")
    return [w.name for w in carried]


def resolve_model(name: str) -> str:
    """The model the run trains, as a path (a local directory, or `tiny` resolved without building it), or
    random-tiny; one line (Refusal) when it is not here."""
    from trace_rl.errors import ConfigError
    from trace_rl.lm.models import RANDOM_TINY, resolve_model_path
    from trace_rl.lm.warm_start import is_tiny

    if name == RANDOM_TINY:
        return name
    if is_tiny(name):
        try:
            return resolve_model_path(name)
        except (ConfigError, FileNotFoundError) as err:
            raise Refusal(f"--model {name}: {err}; or pass --model DIR (a local model directory)") from None
    if not (Path(name).expanduser() / "config.json").is_file():
        raise Refusal(
            f"--model must be tiny, tiny@N, random-tiny or a local model directory with a config.json: {name}"
        )
    return str(Path(name).expanduser())


def guarded(part: str, fn, *args) -> list[dict]:
    """`fn(*args)`'s rows, or one failed row naming the error: a part that raises does not stop the others."""
    t0 = time.perf_counter()
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001 - every failure of a part is reported as its row
        what = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300] if str(err).strip() else ''}"
        return [{"check": f"{part}: raised", "passed": False, "value": what, "tolerance": "no error",
                 "seconds": time.perf_counter() - t0}]  # fmt: skip


def _fmt(x) -> str:
    if isinstance(x, float):
        return f"{x:.3g}"
    return "" if x is None else str(x)[:48]


def table(rows: list[dict], figures: dict) -> str:
    """One table: each check with pass/fail, its measured figure, tolerance and seconds; then the figures."""
    width = max([len(r["check"]) for r in rows] + [5])
    lines = [f"{'check':<{width}}  result  {'measured':<12}  {'tolerance':<32}  seconds"]
    for r in rows:
        result = "pass" if r["passed"] else "FAIL"
        lines.append(
            f"{r['check']:<{width}}  {result:<6}  {_fmt(r['value']):<12}  {r['tolerance']:<32}  {r['seconds']:.1f}"
        )
    for name, figs in figures.items():
        shown = ", ".join(f"{k} {_fmt(v)}" for k, v in figs.items() if v is not None)
        lines.append(f"figures, {name}: {shown}")
    return "\n".join(lines)


def default_json() -> Path:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H%M%SZ")
    return ROOT / "runs" / "gpu_check" / f"gpu_check-{stamp}.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: the dry mode (CPU kernels)")
    ap.add_argument("--model", default="tiny", help="tiny, tiny@N, random-tiny, or a local model directory")
    ap.add_argument("--backend", default="hf", choices=["hf", "vllm"], help="the sampler of the training runs")
    ap.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated: float32, bfloat16")
    ap.add_argument("--parts", default="kernels,train", help="comma-separated: kernels, train (vllm: --backend)")
    ap.add_argument("--json", default="", help="where the table goes as JSON (default runs/gpu_check/...json)")
    ap.add_argument("--out", default="", help="folder of the training runs (default: a new temporary one)")
    ap.add_argument("--env", default="calculator", choices=["calculator", "math"], help="vllm part: environment")
    ap.add_argument("--sandbox", default="", choices=["", "strict", "weak"], help="vllm part with --env math")
    args = ap.parse_args(argv)
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    args.parts = [p for p in args.parts.split(",") if p]
    bad = [d for d in args.dtypes if d not in DTYPES] + [p for p in args.parts if p not in ("kernels", "train")]
    if bad or not args.dtypes:
        ap.error(f"--dtypes takes {', '.join(DTYPES)} and --parts kernels, train; got {bad or 'none'}")
    return args


def run_parts(args: argparse.Namespace, model: str) -> tuple[list[dict], dict]:
    sys.path.insert(0, str(HERE))  # the parts beside this file
    import gpu_check_kernels
    import gpu_check_train

    rows: list[dict] = []
    figures: dict = {}
    if "kernels" in args.parts:
        rows += guarded("kernels", gpu_check_kernels.all_checks, args.device)
    if args.backend == "vllm":
        import gpu_check_vllm

        rows += guarded("vllm", gpu_check_vllm.engine_checks, model, args.device, args.env, args.sandbox, figures)
    out = Path(args.out or tempfile.mkdtemp(prefix="gpu-check-runs-"))
    for dtype in args.dtypes if "train" in args.parts else []:
        got: dict = {}

        def one(dtype=dtype, got=got) -> list[dict]:
            part_rows, figs = gpu_check_train.run_dtype(model, args.backend, dtype, out / dtype, args.device)
            got.update(figs)
            return part_rows

        rows += guarded(f"train {dtype}", one)
        figures[f"train {dtype}"] = got
    return rows, figures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    wheels = Path(os.environ.get("GPU_CHECK_WHEELS") or HERE / "wheels")
    if importlib.util.find_spec("trace_rl") is None:  # run from a checkout without an install
        sys.path.insert(0, str(ROOT / "src"))
    try:
        info = preflight(args.device)
        info["installed_wheels"] = ensure_packages(wheels)
        model = resolve_model(args.model)
    except Refusal as err:
        print(f"gpu_check: {err}", file=sys.stderr)
        return 2
    import transformers

    info["transformers"] = transformers.__version__
    info["triton"] = _version("triton")
    print("gpu_check: " + ", ".join(f"{k} {v}" for k, v in info.items() if v not in (None, [])), flush=True)
    rows, figures = run_parts(args, model)
    wall = time.perf_counter() - started
    print(table(rows, figures))
    failed = [r["check"] for r in rows if not r["passed"]]
    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": args.device,
        "environment": info,
        "model": {"name": args.model, "path": model},
        "backend": args.backend,
        "checks": rows,
        "figures": figures,
        "wall_s": wall,
        "passed": not failed,
    }
    path = Path(args.json) if args.json else default_json()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str))
    print(f"{'PASS' if not failed else f'FAIL: {len(failed)} check(s)'} in {wall:.0f}s; table as JSON: {path}")
    return 1 if failed else 0


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":  # vLLM spawns its engine core: nothing may run at import
    sys.exit(main())
