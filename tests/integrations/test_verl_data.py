"""`trace-rl verl-data` writes the parquet the verl launch script reads, from the project's
math data (a tiny fixture here: rows in two formats, one with several accepted answers); the rows read back as
the same tasks through the project's own reader, carry the chat prompt verl's agent loop expects, and the
example's reward grades against every accepted form. And the launch script's Ray settings on a small machine
(main environment: pyarrow only, no verl)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pq = pytest.importorskip("pyarrow.parquet")

from verl_launch import SCRIPT, launch_overrides  # noqa: E402

from trace_rl.cli import main  # noqa: E402
from trace_rl.envs.data import load_tasks  # noqa: E402
from trace_rl.integrations.verl.data import SYSTEM  # noqa: E402


@pytest.fixture
def rows(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"question": "What is 2 + 3?", "answer": "5"},
                {"problem": "Simplify 2/4.", "answer": ["\\frac{1}{2}", "0.5"]},
                {"question": "What is 7 * 6?", "answer": "42"},
            ]
        )
    )
    val = tmp_path / "val.json"
    val.write_text(json.dumps([{"question": "What is 10 - 4?", "answer": "6"}]))
    return train, val


def test_rows_read_back_as_the_same_tasks_with_the_chat_prompt_and_every_answer(rows, tmp_path, capsys):
    train, val = rows
    out = tmp_path / "verl"
    assert main(["verl-data", f"out={out}", f"train={train}", f"val={val}", "train_limit=2"]) == 0
    assert "train.parquet: 2 rows" in capsys.readouterr().out
    written = pq.read_table(out / "train.parquet").to_pylist()
    assert [r["prompt"][0] for r in written] == [{"role": "system", "content": SYSTEM}] * 2
    assert [r["prompt"][1]["content"] for r in written] == ["What is 2 + 3?", "Simplify 2/4."]
    assert written[1]["reward_model"] == {"style": "rule", "ground_truth": "\\frac{1}{2}"}
    assert written[1]["extra_info"] == {"index": 1, "answers": ["\\frac{1}{2}", "0.5"]}
    assert {r["data_source"] for r in written} == {"train"}
    back = load_tasks(str(out / "train.parquet"))
    assert [(t["question"], t["answer"]) for t in back] == [("What is 2 + 3?", "5"), ("Simplify 2/4.", "\\frac{1}{2}")]
    assert [t["question"] for t in load_tasks(str(out / "val.parquet"))] == ["What is 10 - 4?"]

    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import reward
    finally:
        sys.path.remove(str(SCRIPT.parent))
    row = written[1]
    score = lambda text: reward.compute_score(  # noqa: E731
        row["data_source"], text, row["reward_model"]["ground_truth"], row["extra_info"]
    )
    assert score("so \\boxed{0.5}") == 1.0 and score("\\boxed{1/2}") == 1.0 and score("\\boxed{2}") == 0.0


@pytest.mark.parametrize(
    "args, key",
    [(["train_limit=-1"], "train_limit"), (["train={tmp}/none.jsonl"], "train"), (["val=nosuchbench"], "val")],
)
def test_bad_settings_are_one_line(rows, tmp_path, capsys, args, key):
    train, val = rows
    argv = ["verl-data", f"out={tmp_path / 'o'}", f"train={train}", f"val={val}"] + [
        a.format(tmp=tmp_path) for a in args
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: {key}" in err, err


@pytest.mark.parametrize("cpus, expected", [(2, "32 1"), (64, "64 8")])
def test_the_launch_script_gives_ray_the_cpus_transferqueue_needs(cpus, expected):
    """On 2 CPUs Ray counted 2 and TransferQueue's 8 storage actors were never scheduled (a silent hang)."""
    text = Path(SCRIPT).read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith(("RAY_NUM_CPUS=", "TQ_STORAGE_UNITS="))]
    assert len(lines) == 2
    script = f"NCPU={cpus}\n" + "\n".join(lines) + '\necho "$RAY_NUM_CPUS $TQ_STORAGE_UNITS"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, env={})
    assert out.stdout.strip() == expected
    overrides = launch_overrides(num_cpus="N", storage_units="U")
    assert "ray_kwargs.ray_init.num_cpus=N" in overrides
    assert "transfer_queue.backend.SimpleStorage.num_data_storage_units=U" in overrides
