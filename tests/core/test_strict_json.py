"""Every file a run writes is strict JSON (jq and browsers refuse bare NaN): the one helper maps NaN and infinities
to null, numpy's too, and the writers of run files go through it (a scan of the source finds no other)."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trace_rl.rollout.report import summarize, write_summary
from trace_rl.safe_read import loads
from trace_rl.strict_json import dumps, finite, write_json
from trace_rl.tree import RolloutTree, load_trees, save_trees

SRC = Path(__file__).resolve().parents[2] / "src" / "trace_rl"


def test_non_finite_numbers_become_null_at_any_depth_and_numpy_values_are_plain():
    doc = {
        "a": math.nan,
        "b": [1.0, -math.inf, {"c": np.float32("nan"), "d": np.float64(0.5)}],
        "e": (np.int64(3), np.bool_(True)),
        "f": np.array([1.0, np.inf]),
        "g": "NaN",
    }
    assert finite(doc) == {
        "a": None,
        "b": [1.0, None, {"c": None, "d": 0.5}],
        "e": [3, True],
        "f": [1.0, None],
        "g": "NaN",
    }
    text = dumps(doc, indent=1, allow_nan=True)  # asked for NaN: still strict
    assert loads(text) == finite(doc)  # safe_read.loads refuses NaN and Infinity


def test_write_json_writes_a_strict_document_with_a_final_newline(tmp_path):
    path = write_json(tmp_path / "x.json", {"se": float("nan"), "where": tmp_path}, default=str)
    text = path.read_text()
    assert text.endswith("}\n") and loads(text) == {"se": None, "where": str(tmp_path)}


def test_rollout_summary_of_grpo_holds_null_for_its_flip_rate(tmp_path, capsys):
    # GRPO never branches: no continuation, so flips per continuation is NaN in the row and null in the file
    recs = [
        {
            "method": "grpo",
            "step": s,
            "rollout/effective_ratio": 0.5,
            "rollout/rollouts": 64,
            "rollout/continuations": 0,
        }
        for s in range(2)
    ]
    rows = summarize({"grpo": recs})
    assert math.isnan(rows[0]["flip_rate"])
    write_summary(tmp_path / "rollout_summary", rows, "table")
    back = loads((tmp_path / "rollout_summary.json").read_text())
    assert back[0]["flip_rate"] is None and back[0]["method"] == "grpo"
    assert capsys.readouterr().out == "table\n"


def test_trees_with_a_nan_prediction_are_written_strictly_and_read_back(tmp_path):
    tree = RolloutTree(0, "q", predicted=math.nan)
    tree.add_turn("0", action="a", terminal=True, reward=1.0)
    save_trees(tmp_path / "t.jsonl", [tree], extra={"method": "trace", "step": 0})
    line = (tmp_path / "t.jsonl").read_text().splitlines()[0]
    assert loads(line)["nodes"][0]["predicted"] is None
    assert load_trees(tmp_path / "t.jsonl")[0].root.predicted is None  # null: as a node nothing scored


# Writers that may keep Python's NaN, each with why: files read back only by trace-rl itself, for exact state.
NOT_STRICT = {
    "train/checkpoint.py": "trainer_state.json: a resume reads its NaN standard error back as it was",
    "predictors/history.py": "the reward history's own state file, loaded back by it",
    "train/sft.py": "the warm start's report and manifest (warm_start owns their format and digest)",
    "lm/warm_start.py": "hashes settings; writes no run file",
}
WRITES = re.compile(r"(write_text|\.write)\(\s*json\.dumps\(|json\.dump\(")


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_no_run_file_is_written_with_plain_json_dumps(path):
    rel = str(path.relative_to(SRC))
    hits = [n for n, line in enumerate(path.read_text().splitlines(), 1) if WRITES.search(line)]
    hits = [n for n in hits if "allow_nan=False" not in path.read_text().splitlines()[n - 1]]
    if rel in NOT_STRICT:
        return
    assert not hits, f"{rel}:{hits} writes JSON without trace_rl.strict_json (NaN would be written bare)"


def test_the_scan_sees_a_plain_writer():
    assert WRITES.search('(out / "x.json").write_text(json.dumps(rows, indent=2))')
    assert WRITES.search("        json.dump(state, fh)")
    assert not WRITES.search("text = dumps(rows)")
    assert json.loads(dumps([math.inf])) == [None]


def test_it_writes_without_loading_numpy():
    # the configuration imports the trees' writer, which imports this module: it must stay numpy-free
    code = (
        "import sys; from trace_rl.strict_json import dumps; "
        "assert dumps({'a': float('nan'), 'b': (1, 2.5)}) == '{\"a\": null, \"b\": [1, 2.5]}'; "
        "assert 'numpy' not in sys.modules, 'numpy was imported'"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": str(SRC.parent)}
    )
    assert proc.returncode == 0, proc.stderr
