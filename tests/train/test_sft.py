import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trace_rl.agent.react import ChatFormat  # noqa: E402
from trace_rl.envs.calculator import make_tasks  # noqa: E402
from trace_rl.lm.models import create_tiny_model  # noqa: E402
from trace_rl.train.sft import SFTParams, demo_sequence, train_sft  # noqa: E402


def test_demo_sequences_mask_only_assistant_turns():
    _, tok = create_tiny_model(hidden=32, layers=1, heads=2)
    ids, mask = demo_sequence(make_tasks(1, seed=0, steps=(2,))[0], ChatFormat(tok))
    assert len(ids) == len(mask)
    supervised = tok.decode([i for i, m in zip(ids, mask) if m])
    assert supervised.count("Action: ") == 3 and "Observation" not in supervised


def test_sft_reduces_the_loss_quickly():
    model, tok = create_tiny_model(hidden=48, layers=2, heads=2)
    tasks = make_tasks(64, seed=1, steps=(1,), digits=(1,))
    first = train_sft(model, tok, tasks, max_steps=1, params=SFTParams(batch_size=4, lr=5e-3), log_every=0)
    later = train_sft(model, tok, tasks, max_steps=40, params=SFTParams(batch_size=4, lr=5e-3), log_every=0)
    assert later["loss"] < first["loss"]


def test_one_seed_gives_one_model():
    # the schedule follows steps, not the wall clock, so a slower machine trains the same model
    weights = []
    for _ in range(2):
        model, tok = create_tiny_model(hidden=32, layers=1, heads=2, seed=3)
        train_sft(
            model,
            tok,
            make_tasks(16, seed=2),
            max_steps=6,
            params=SFTParams(batch_size=2, lr=5e-3, warmup_steps=1),
            seed=4,
            log_every=0,
        )
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(weights[0], weights[1])


def test_default_trains_by_steps_and_a_cap_reports_an_early_stop():
    model, tok = create_tiny_model(hidden=32, layers=1, heads=2)
    tasks = make_tasks(16, seed=2, steps=(1,), digits=(1,))
    full = train_sft(model, tok, tasks, max_steps=3, params=SFTParams(batch_size=2), log_every=0)
    assert full["steps"] == 3 and not full["stopped_early"]  # no wall-clock cap by default
    capped = train_sft(
        model, tok, tasks, max_steps=10_000, params=SFTParams(batch_size=2, max_minutes=1e-6), log_every=0
    )
    assert capped["stopped_early"] and capped["steps"] < 10_000


def test_the_progress_line_has_the_total_and_the_time_left_and_changes_no_weight(capsys):
    weights = []
    for log_every in (0, 2):
        model, tok = create_tiny_model(hidden=32, layers=1, heads=2, seed=3)
        params = SFTParams(batch_size=2, lr=5e-3, warmup_steps=1)
        train_sft(model, tok, make_tasks(16, seed=2), max_steps=6, params=params, seed=4, log_every=log_every)
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(weights[0], weights[1])  # the line is printing only
    shown = capsys.readouterr().err.replace("\r", "\n").splitlines()
    steps = [line for line in shown if line.startswith("sft step")]
    assert [line.split()[2] for line in steps] == ["2/6", "4/6", "6/6"]
    assert steps[0].endswith(" left") and " so far" in steps[0] and "left" not in steps[-1]
