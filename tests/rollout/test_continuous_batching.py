"""Continuous batching (`engine.batching=continuous`): every episode's turn is its own backend call, sent as soon as
its previous environment step ends. The trees must be those of round batching, node for node and in the same
order (turns are appended afterwards in round order), whatever order the calls come back in; calls overlap, and
the step's generate time counts the time any call was in flight, never the sum."""

import asyncio

import pytest

pytest.importorskip("transformers")

from helpers_calc import scripted_calc  # noqa: E402

from trace_rl.backends.base import Generation, SamplingParams, ScriptedBackend, VersionedBackend  # noqa: E402
from trace_rl.envs.calculator import CalculatorEnv, make_tasks  # noqa: E402
from trace_rl.lm.tokenizer import byte_tokenizer  # noqa: E402
from trace_rl.methods import BudgetPlan, get_method  # noqa: E402
from trace_rl.predictors.history import RewardHistoryPredictor  # noqa: E402
from trace_rl.rollout.engine import TreeRolloutEngine  # noqa: E402
from trace_rl.rollout.lm_actor import LMActor  # noqa: E402


class SeededCalc(VersionedBackend):
    """A calculator agent whose answer depends on the row's seed and prompt only (not on its batch), and whose
    calls take a time drawn from the seed, so concurrent calls come back in another order than they went out."""

    concurrent_calls = True

    def __init__(self, tok):
        self.tokenizer, self.calls, self.in_flight, self.most_in_flight = tok, [], 0, 0

    def generate(self, prompts, params, seed=None, seeds=None) -> list[Generation]:
        out = []
        for prompt, s in zip(prompts, seeds):
            text = scripted_calc(self.tokenizer.decode(list(prompt)), s % 5, wrong_every=2) + self.tokenizer.eos_token
            ids = self.tokenizer(text, add_special_tokens=False).input_ids[: params.max_new_tokens]
            out.append(Generation(ids, [-0.5] * len(ids), "stop", self.tokenizer.decode(ids)))
        self.calls.append(len(prompts))
        return out

    async def agenerate(self, prompts, params, seeds=None) -> list[Generation]:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep((seeds[0] % 7) * 0.002)
            return self.generate(prompts, params, seeds=seeds)
        finally:
            self.in_flight -= 1


PLAN = BudgetPlan(prompts=3, rollouts_per_prompt=4, branch_factor=1, pool_factor=2, max_per_prompt=4)


def grown(batching: str, method: str):
    backend = SeededCalc(byte_tokenizer())
    actor = LMActor(backend, CalculatorEnv, SamplingParams(max_new_tokens=64), batching=batching)
    engine = TreeRolloutEngine(actor, RewardHistoryPredictor(), PLAN, seed=3)
    tasks = make_tasks(PLAN.pool, seed=4, steps=(1, 2, 3))
    return engine.grow(tasks, get_method(method), step=1), backend, engine, tasks


@pytest.mark.parametrize("method", ["trace", "grpo", "treepo"])
def test_trees_are_round_batchings_node_for_node(method):
    ref, ref_backend, _, _ = grown("round", method)
    got, backend, _, _ = grown("continuous", method)
    assert [t.to_dict() for t in got.trees] == [t.to_dict() for t in ref.trees]  # ids, order, tokens, rewards
    assert [list(t.nodes) for t in got.trees] == [list(t.nodes) for t in ref.trees]  # the nodes' order too
    assert (got.generated_tokens, got.rollouts, got.continuations) == (
        ref.generated_tokens,
        ref.rollouts,
        ref.continuations,
    )
    assert set(backend.calls) == {1} and len(backend.calls) == sum(ref_backend.calls)  # one call per episode turn
    assert backend.most_in_flight > PLAN.prompts  # calls overlapped, several per prompt
    assert got.time["generate"] <= got.time["total"]  # the union of the calls, not their sum


def test_evaluation_is_round_batchings_too():
    _, _, ref_engine, tasks = grown("round", "grpo")
    _, _, engine, _ = grown("continuous", "grpo")
    ref, got = ref_engine.evaluate(tasks[:4], samples=3), engine.evaluate(tasks[:4], samples=3)
    assert [t.to_dict() for t in got.trees] == [t.to_dict() for t in ref.trees]
    assert got.generated_tokens == ref.generated_tokens


def test_a_backend_that_serves_one_call_at_a_time_is_refused():
    tok = byte_tokenizer()
    with pytest.raises(ValueError, match="batching=continuous needs a backend that serves calls at once"):
        LMActor(ScriptedBackend(tok, lambda text, i: "x"), CalculatorEnv, SamplingParams(), batching="continuous")


def test_the_clock_counts_overlapping_calls_once():
    from trace_rl.rollout.grow import Clock

    clock, t = Clock(), [0.0]
    import trace_rl.rollout.grow as grow

    real = grow.time.perf_counter
    grow.time.perf_counter = lambda: t[0]
    try:
        clock.started("generate")  # 0 .. 3
        t[0] = 1.0
        clock.started("generate")  # 1 .. 2, inside the first
        t[0] = 2.0
        clock.finished("generate")
        t[0] = 3.0
        clock.finished("generate")
        t[0] = 5.0
        clock.started("generate")  # 5 .. 6
        t[0] = 6.0
        clock.finished("generate")
    finally:
        grow.time.perf_counter = real
    assert clock.seconds["generate"] == 4.0  # 3 + 1, not 3 + 1 + 1


class FailingCalc(SeededCalc):
    """The tenth call fails; the other episodes would go on sampling if nothing stopped them."""

    async def agenerate(self, prompts, params, seeds=None):
        self.started = getattr(self, "started", 0) + 1
        if self.started == 10:
            raise RuntimeError("the engine died")
        return await super().agenerate(prompts, params, seeds)


def test_a_failing_episode_stops_the_others():
    backend = FailingCalc(byte_tokenizer())
    actor = LMActor(backend, CalculatorEnv, SamplingParams(max_new_tokens=64), batching="continuous")
    engine = TreeRolloutEngine(actor, RewardHistoryPredictor(), PLAN, seed=3)

    async def caller():  # inside the caller's own loop: nothing but the engine would end stray episodes
        with pytest.raises(RuntimeError, match="the engine died"):
            await engine.agrow(make_tasks(PLAN.pool, seed=4, steps=(2, 3)), get_method("grpo"), step=1)
        started = backend.started
        await asyncio.sleep(0.05)  # calls already sent finish; no episode may send another
        return started, [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    started, left = asyncio.run(caller())
    assert left == [] and backend.started == started
