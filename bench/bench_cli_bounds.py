"""The command-line cases of issue 50 (item 6) and their classes: does each end in one line (exit code 2, one line
on stderr, no traceback) within 60 s, and does no environment variable reach a run's config.yaml?

    PYTHONPATH=src python bench/bench_cli_bounds.py                  # this checkout
    git archive REV src | tar -x -C /tmp/rev && python bench/bench_cli_bounds.py --src /tmp/rev/src   # another

Each case runs `python -m trace_rl.cli` in a fresh process with PYTHONPATH=--src; about a minute in all when every
case is refused (a case that runs on is stopped at 60 s)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SECRET = "s3cret-value"


def cases(tmp: Path) -> list[list[str]]:
    return [
        ["view", str(tmp / "trees_x.jsonl"), "out=/etc/passwd/x.html"],
        ["train", "logger=" + ",".join(["none"] * 20_000), f"out={tmp}/t1"],
        ["eval", "data=" + "a" * 100_000, f"out={tmp}/e1"],
        ["diagnose", f"{tmp}/run", "max_depth=1000000"],
        ["train", "steps=99999999999999999999", f"out={tmp}/t2"],
        ["simulate", "--config", f"{tmp}/env.yaml", f"out={tmp}/s1", "steps=1"],
        ["simulate", "--config", f"{tmp}/seeds.yaml", f"out={tmp}/s2"],
        ["simulate", "seeds=" + ",".join(map(str, range(2_000))), f"out={tmp}/s3"],
        ["simulate", "steps=[" + ",".join(["1"] * 20_000) + "]"],
        ["eval", f"data={tmp}/" + "a" * 300, f"out={tmp}/e2"],
        ["view", f"{tmp}/" + "a" * 300],
        ["simulate", f"out={tmp}/" + "a" * 300],
        ["simulate", "budget.prompts=1000000000", f"out={tmp}/s4"],
        ["simulate", f"out={tmp}/" + "${oc.env:TRACE_RL_BENCH_SECRET}", "steps=1"],
        ["train", "env=bfcl", "env.bfcl.call_timeout_s=inf", f"out={tmp}/t3", "steps=1"],
        ["train", "env=bfcl", "env.bfcl.call_timeout_s=nan", f"out={tmp}/t4", "steps=1"],
    ]


def prepare(tmp: Path, env: dict) -> None:
    """A trees file, a finished simulate run (for diagnose) and the --config files the cases name."""
    code = "import sys; from trace_rl.tree import RolloutTree, save_trees; save_trees(sys.argv[1], [RolloutTree(0)])"
    subprocess.run([sys.executable, "-c", code, str(tmp / "trees_x.jsonl")], env=env, check=True)
    run = [sys.executable, "-m", "trace_rl.cli", "simulate", "steps=5", "seeds=0", f"out={tmp}/run"]
    subprocess.run(run, env=env, capture_output=True, check=True)
    (tmp / "seeds.yaml").write_text("seeds: [" + ",".join(map(str, range(100_000))) + "]\n")
    (tmp / "env.yaml").write_text("env:\n  hint_noise: ${oc.env:TRACE_RL_BENCH_SECRET,0.3}\n")


def leaked(tmp: Path) -> bool:
    """The secret in a config.yaml or a folder name; both are removed for the next case."""
    found = False
    for path in list(tmp.rglob("config.yaml")):
        found |= SECRET in path.read_text(errors="replace")
        path.unlink()
    if (tmp / SECRET).exists():
        found = True
        shutil.rmtree(tmp / SECRET)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"))
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": args.src, "TRACE_RL_BENCH_SECRET": SECRET, "HF_HUB_OFFLINE": "1"}
    tmp = Path(tempfile.mkdtemp(prefix="cli-bounds-"))
    try:
        prepare(tmp, {**env, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")})
        ok, all_cases = 0, cases(tmp)
        for argv in all_cases:
            try:
                proc = subprocess.run(
                    [sys.executable, "-m", "trace_rl.cli", *argv], capture_output=True, text=True, timeout=60, env=env
                )
                err = proc.stderr.strip()
                one = proc.returncode == 2 and err.count("\n") == 0 and "Traceback" not in err
                said = err.splitlines()[-1][:100] if err else f"exit {proc.returncode}"
            except subprocess.TimeoutExpired:
                one, said = False, "still running after 60 s"
            secret = leaked(tmp)
            ok += one and not secret
            verdict = "one line" if one and not secret else "FAILS   "
            print(f"{verdict} {' '.join(argv)[:56]:56} | {said}{' | SECRET WRITTEN' if secret else ''}")
        print(f"{ok} of {len(all_cases)} cases one line")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
