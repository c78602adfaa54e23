"""bench/bench_predictor.py runs against the current engine and predictors at its --quick size on the tiny random
policy, with the light predictor, the random causal critic and a named critic (a random tiny model saved to a
folder, built as predictor.kind=PATH is); each predictor is updated by the step, and the causal critics'
prefix sharing encodes fewer tokens than scoring every prefix alone. No timing is asserted."""

import importlib.util
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "bench_predictor.py"
_spec = importlib.util.spec_from_file_location("bench_predictor", SCRIPT)
bench_predictor = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_predictor)  # runs nothing: main() is behind __name__ == "__main__"


def test_quick_run_measures_every_predictor(tmp_path, capsys):
    from trace_rl.lm.models import create_tiny_model

    model, tok = create_tiny_model(seed=1)
    model.model.save_pretrained(tmp_path / "critic")  # the backbone alone, as AutoModel loads it
    tok.save_pretrained(tmp_path / "critic")
    out = bench_predictor.main(["--quick", "--model", "random-tiny", "--critic", str(tmp_path / "critic")])
    text = capsys.readouterr().out
    assert len(out) == 3
    light, random_critic, named = out.values()
    for r in out.values():
        assert r["rollouts"] > 0 and 0 < r["predictor"] <= r["total"] and 0 < r["generate"] <= r["total"]
        assert len(r["losses"]) == 1 and all(loss is not None and math.isfinite(loss) for loss in r["losses"])
    assert light["tokens_naive"] == 0  # no LM: nothing encoded
    for r in (random_critic, named):  # causal: the prompt's KV is shared by every prefix of its tree
        assert 0 < r["tokens_encoded"] < r["tokens_naive"]
    assert text.count("% of the step") == 3 and "one prefix at a time" in text


def test_a_critic_that_is_not_one_is_one_line_before_any_step(capsys):
    with pytest.raises(SystemExit) as stop:
        bench_predictor.main(["--quick", "--model", "random-tiny", "--critic", "no-such-critic"])
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and err.count("\n") == 1 and "kind: 'no-such-critic'" in err
    assert "% of the step" not in out
