"""bench/gpu_check_vllm.py's comparison of the HF step against the vLLM step (check 4), without vLLM or a GPU."""

import importlib.util
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_check_vllm.py"
_spec = importlib.util.spec_from_file_location("gpu_check_vllm", SCRIPT)
vllm_part = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vllm_part)  # defines functions only


def figures(rollouts, tokens, reward):
    return {"rollouts": rollouts, "tokens": tokens, "mean_reward": reward}


def test_two_samples_of_one_policy_pass():
    # the CPU run in docs/engines.md: 4,750 tokens on vLLM, 5,266 on HF over the same plan
    results = vllm_part.compare_steps(figures(32, 4750, 0.0), figures(32, 5266, 0.0))
    assert [ok for ok, _ in results] == [True, True]
    assert "1.11x" in results[0][1]


def test_a_backend_that_lost_its_context_fails_both_ways():
    # HF with a dropped KV cache: 6,092 tokens against vLLM's 1,056, reward 0 against vLLM's
    (tokens_ok, tokens_what), (reward_ok, reward_what) = vllm_part.compare_steps(
        figures(32, 1056, 0.5), figures(32, 6092, 0.0)
    )
    assert not tokens_ok and "5.77x" in tokens_what
    assert not reward_ok and "0.000 vs 0.500" in reward_what
    assert not vllm_part.compare_steps(figures(32, 6092, 0.5), figures(32, 1056, 0.5))[0][0]  # too few, too


@pytest.mark.parametrize(
    "vllm, hf, passed",
    [
        (figures(10, 1000, 0.5), figures(20, 2990, 0.5), [True, True]),  # per rollout: 149.5 vs 100, inside 1.5x
        (figures(10, 1000, 0.5), figures(10, 1510, 0.5), [False, True]),
        (figures(10, 1000, 0.5), figures(10, 1000, 0.75), [True, True]),  # the reward bound is inclusive
        (figures(10, 1000, 0.5), figures(10, 1000, 0.76), [True, False]),
        (figures(10, 1000, math.nan), figures(10, 1000, 0.5), [True, False]),  # no finished rollout on a side
        (figures(10, 0, 0.0), figures(10, 0, 0.0), [False, True]),  # nothing generated is no agreement
    ],
)
def test_the_stated_bounds(vllm, hf, passed):
    assert [ok for ok, _ in vllm_part.compare_steps(vllm, hf)] == passed


def test_no_rollouts_is_one_failure():
    assert vllm_part.compare_steps(figures(0, 0, math.nan), figures(4, 40, 0.0)) == [
        (False, "both steps produced rollouts (vLLM 0, HF 4)")
    ]


def test_step_figures_average_the_finished_rollouts_of_every_tree():
    from trace_rl.tree import RolloutTree

    trees = []
    for i, rewards in enumerate([[1.0, 0.0], [1.0, 1.0]]):
        tree = RolloutTree(i, prompt="p")
        for r in rewards:
            tree.add_turn(str(i), action="a", terminal=True, reward=r)
        tree.add_turn(str(i), action="unfinished")
        trees.append(tree)
    res = SimpleNamespace(trees=trees, rollouts=5, generated_tokens=70)
    assert vllm_part.step_figures(res) == {"rollouts": 5, "tokens": 70, "mean_reward": 0.75}


def test_the_math_environment_needs_a_chosen_sandbox():
    # the math tool runs model code: its containment is a choice to write down, refused before any model loads
    with pytest.raises(ValueError, match="--env math needs --sandbox strict|weak"):
        vllm_part.engine_checks("random-tiny", "cpu", "math", "", {})
