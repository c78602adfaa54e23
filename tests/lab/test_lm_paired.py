"""lab/scripts/lm_paired.py on a hand-written compare folder: paired differences between any two methods, by hand, and
the refusals (no such method, no common pair, tuning seeds left out unless asked)."""

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")  # the script reads runs through trace_rl.train.compare

SCRIPT = Path(__file__).resolve().parents[2] / "lab" / "scripts" / "lm_paired.py"
_spec = importlib.util.spec_from_file_location("lm_paired", SCRIPT)
lm_paired = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lm_paired)


def _write_run(out: Path, method_dir: str, pair: str, seed: int, before: float, accs: list[float], er: float):
    """A finished 2-step run: an evaluation after each step, 10 rollouts and 100 tokens a step."""
    run = out / method_dir / pair
    run.mkdir(parents=True)
    recs = [
        {
            "method": method_dir,
            "step": k,
            "rollout/rollouts": 10,
            "rollout/generated_tokens": 100,
            "rollout/effective_ratio": er,
            "rollout/continuations": 4,
            "rollout/flips": 1,
            "rollout/contrast_groups": 2,
            "alloc/active_prompts": 4,
            "train/update_kl": 0.002,
            "train/update_scale": 1.0 if er == 0.5 else 0.5,  # the KL bound scaled every step of the er-0.25 runs
            "train/rollouts_total": 10 * (k + 1),
            "eval/accuracy": acc,
        }
        for k, acc in enumerate(accs)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    summary = {"seed": seed, "accuracy_before": before, "accuracy_after": accs[-1]}
    (run / "train_summary.json").write_text(json.dumps(summary))


@pytest.fixture
def study(tmp_path):
    out = tmp_path / "cmp"
    for pair, warm, seed in (("seed100", 0, 100), ("ws2-seed100", 2, 100), ("seed101", 0, 101), ("seed3", 0, 3)):
        _write_run(out, "grpo", pair, seed, 0.5, [0.55, 0.60], er=0.5)
        _write_run(out, "trace_adv-grpo", pair, seed, 0.5, [0.60, 0.70 if warm == 0 else 0.64], er=0.25)
    return out


def test_differences_by_hand(study):
    runs = lm_paired.load(study, ["trace:grpo", "grpo"], tuning=False)
    assert sorted(runs["grpo"]) == ["seed100", "seed101", "ws2-seed100"]  # seed 3 is a tuning seed: left out
    row = lm_paired.pair_row("trace:grpo", "grpo", runs)
    assert row["pairs"] == "3"
    # final: +0.10, +0.04, +0.10 -> mean +0.08; mean of evaluations: (0.05 + 0.10)/2, (0.05 + 0.04)/2, ...
    assert row["final"].startswith("+0.080 [")
    assert row["mean_of_evals"].startswith(f"{(0.075 + 0.045 + 0.075) / 3:+.3f} [")
    assert row["equal_tokens"].startswith("+0.080 [")  # same tokens spent: read at the end of both
    assert row["er_a/er_b"] == "0.50"
    assert row["er_a - er_b"] == "-0.250 [-0.250, -0.250]"  # 0.25 against 0.5 in every pair
    assert row["final by warm start"] == "tiny@0: +0.100, tiny@2: +0.040"
    row = lm_paired.method_row("grpo", runs["grpo"])
    assert row["gain"].startswith("+0.100 [")
    assert row["flips/continuation"] == "0.250" and row["groups/1k rollouts"] == "200" and row["tokens"] == "200"
    assert row["mixed prompts/step"] == "2.00"  # effective ratio 0.5 of 4 prompts


def test_tuning_seeds_only_when_asked(study):
    assert "seed3" in lm_paired.load(study, ["grpo"], tuning=True)["grpo"]


def test_seeds_keep_only_those_runs(study, capsys):
    runs = lm_paired.load(study, ["grpo"], tuning=False, seeds=lm_paired.parse_seeds("100"))
    assert sorted(runs["grpo"]) == ["seed100", "ws2-seed100"]
    assert lm_paired.parse_seeds("100-102, 105") == {100, 101, 102, 105}
    assert lm_paired.main([str(study), "--pair", "trace_adv-grpo", "grpo", "--seeds", "101"]) == 0
    out = capsys.readouterr().out
    assert "tiny@0: +0.100" in out and "tiny@2" not in out  # only seed101's pair (warm start 0) is read
    for bad in ("10x", "111-108", "1,,2"):
        with pytest.raises(SystemExit, match="--seeds"):
            lm_paired.parse_seeds(bad)
    with pytest.raises(SystemExit, match="no finished run of 'grpo' on evaluation seeds of --seeds"):
        lm_paired.load(study, ["grpo"], tuning=False, seeds={107})


def test_main_prints_both_tables_and_plots(study, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "acc.png"
    assert lm_paired.main([str(study), "--pair", "trace_adv-grpo", "grpo", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "trace:grpo - grpo" in out and "effective_ratio" in out
    assert png.read_bytes().startswith(b"\x89PNG")


def test_every_method_is_read_on_the_pairs_all_hold(study):
    runs = lm_paired.load(study, ["trace:grpo", "grpo"], tuning=False)
    del runs["trace:grpo"]["seed101"]
    kept, dropped = lm_paired.common_pairs(runs)
    assert sorted(kept["grpo"]) == ["seed100", "ws2-seed100"] and dropped == ["seed101"]
    assert lm_paired.method_row("grpo", kept["grpo"])["pairs"] == "2"


def test_refusals(study, tmp_path):
    with pytest.raises(SystemExit, match="no finished run of 'pcl'"):
        lm_paired.load(study, ["pcl"], tuning=False)
    with pytest.raises(SystemExit, match="not a directory"):
        lm_paired.main([str(tmp_path / "nowhere"), "--pair", "a", "b"])
    runs = {"a": {"seed100": {}}, "b": {"seed101": {}}}
    with pytest.raises(SystemExit, match="share no finished pair"):
        lm_paired.pair_row("a", "b", runs)


def test_drivers_centre_within_pairs_by_hand(study):
    runs, _ = lm_paired.common_pairs(lm_paired.load(study, ["trace:grpo", "grpo"], tuning=False))
    rows = {r["statistic"]: r for r in lm_paired.drivers(runs, resamples=200)}
    # within every pair trace:grpo has the lower effective ratio (0.25 vs 0.5) and the larger gain; centred, x is
    # -/+0.125 in each pair and the gain -/+0.05, 0.02, 0.05: r = -0.03 / sqrt(6 * 0.125**2 * 2 * 0.0054) = -0.943;
    # the slope -0.03 / 0.09375 = -0.32 is the mean gain difference over the ratio difference, -0.08 / 0.25
    er = rows["effective ratio"]
    assert er["within-pair r with gain"].startswith("-0.94 [")
    assert er["gain points per unit"] == f"{100 * -0.08 / 0.25:+.3f}"
    assert er["mean by method"] == "trace:grpo 0.25, grpo 0.50"
    # prompts a step is 4 for every run: nothing to correlate, said as nan rather than a number
    assert rows["prompts a step"]["within-pair r with gain"].startswith("+nan")
    assert rows["update KL a step (x1e3)"]["mean by method"] == "trace:grpo 2.00, grpo 2.00"
    assert rows["steps the KL bound scaled"]["mean by method"] == "trace:grpo 1.00, grpo 0.00"
    assert rows["steps the KL bound scaled"]["within-pair r with gain"].startswith("+0.94 [")


def test_main_prints_the_drivers_table(study, capsys):
    assert lm_paired.main([str(study), "--pair", "trace_adv-grpo", "grpo", "--drivers"]) == 0
    out = capsys.readouterr().out
    assert "what tracks the gain over 2 methods x 3 pairs" in out and "mixed prompts a step" in out


def test_a_method_directory_elsewhere_is_read_under_its_own_name(study, tmp_path, capsys):
    other = tmp_path / "variant"
    for pair, seed in (("seed100", 100), ("ws2-seed100", 100)):  # seed101 missing: that pair is left out
        _write_run(other, "trace_adv-grpo", pair, seed, 0.5, [0.6, 0.8], er=0.5)
    extra = {"tg_var": other / "trace_adv-grpo"}
    runs = lm_paired.load(study, ["tg_var", "grpo"], tuning=False, extra=extra)
    assert sorted(runs["tg_var"]) == ["seed100", "ws2-seed100"]
    assert lm_paired.pair_row("tg_var", "grpo", runs)["final"].startswith("+0.200 [")
    assert lm_paired.main([str(study), "--pair", "tg_var", "grpo", "--runs", f"tg_var={other / 'trace_adv-grpo'}"]) == 0
    assert "left out (not finished by every method): seed101" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="give NAME=DIR"):
        lm_paired.main([str(study), "--pair", "a", "grpo", "--runs", "a"])
    with pytest.raises(SystemExit, match="not a directory"):
        lm_paired.load(study, ["x"], tuning=False, extra={"x": tmp_path / "nowhere"})


def test_studies_on_other_seeds_are_pooled_and_a_pair_found_twice_is_refused(study, tmp_path, capsys):
    more = tmp_path / "more"  # the same methods on another evaluation seed, in a study of its own
    _write_run(more, "grpo", "seed102", 102, 0.5, [0.55, 0.60], er=0.5)
    _write_run(more, "trace_adv-grpo", "seed102", 102, 0.5, [0.60, 0.50], er=0.25)
    runs = lm_paired.load([study, more], ["trace:grpo", "grpo"], tuning=False)
    assert sorted(runs["grpo"]) == ["seed100", "seed101", "seed102", "ws2-seed100"]
    # finals +0.10, +0.10, +0.04 and now -0.10: mean +0.035
    assert lm_paired.pair_row("trace:grpo", "grpo", runs)["final"].startswith("+0.035 [")
    variant = tmp_path / "variant"
    _write_run(variant, "trace_adv-grpo", "seed100", 100, 0.5, [0.6, 0.8], er=0.5)
    extra = {"tg": [variant / "trace_adv-grpo", more / "trace_adv-grpo"]}
    assert sorted(lm_paired.load(study, ["tg"], tuning=False, extra=extra)["tg"]) == ["seed100", "seed102"]
    pooled = f"tg={variant / 'trace_adv-grpo'},{more / 'trace_adv-grpo'}"
    assert lm_paired.main([str(study), str(more), "--pair", "tg", "grpo", "--runs", pooled]) == 0
    out = capsys.readouterr().out
    assert "left out (not finished by every method): seed101, ws2-seed100" in out and "tg - grpo" in out
    with pytest.raises(SystemExit, match="pair seed100 is in two of the pooled directories"):
        lm_paired.load([study, study], ["grpo"], tuning=False)
