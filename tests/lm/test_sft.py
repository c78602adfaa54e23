import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trace_rl.agent.react import ChatFormat  # noqa: E402
from trace_rl.envs.calculator import make_tasks  # noqa: E402
from trace_rl.lm.models import create_tiny_model  # noqa: E402
from trace_rl.lm.sft import demo_sequence, train_sft  # noqa: E402


def test_demo_sequences_mask_only_assistant_turns():
    _, tok = create_tiny_model(hidden=32, layers=1, heads=2)
    ids, mask = demo_sequence(make_tasks(1, seed=0, steps=(2,))[0], ChatFormat(tok))
    assert len(ids) == len(mask)
    supervised = tok.decode([i for i, m in zip(ids, mask) if m])
    assert supervised.count("Action: ") == 3 and "Observation" not in supervised


def test_sft_reduces_the_loss_quickly():
    model, tok = create_tiny_model(hidden=48, layers=2, heads=2)
    tasks = make_tasks(64, seed=1, steps=(1,), digits=(1,))
    first = train_sft(model, tok, tasks, max_steps=1, batch_size=4, lr=5e-3, log_every=0)
    later = train_sft(model, tok, tasks, max_steps=40, batch_size=4, lr=5e-3, log_every=0)
    assert later["loss"] < first["loss"]
