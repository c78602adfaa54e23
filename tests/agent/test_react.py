import asyncio

import pytest

pytest.importorskip("transformers")

from helpers_calc import scripted_calc  # noqa: E402

from trace_rl.agent.react import ChatFormat  # noqa: E402
from trace_rl.backends.base import SamplingParams, ScriptedBackend  # noqa: E402
from trace_rl.envs.calculator import CalculatorEnv, make_tasks  # noqa: E402
from trace_rl.lm.tokenizer import byte_tokenizer  # noqa: E402
from trace_rl.rollout.grow import Clock, lockstep  # noqa: E402
from trace_rl.rollout.lm_actor import LMActor  # noqa: E402
from trace_rl.tree import BARE  # noqa: E402


def test_histories_grow_token_by_token_and_match_a_full_render():
    tok = byte_tokenizer()
    fmt = ChatFormat(tok)
    task = make_tasks(1, seed=3, steps=(3,))[0]
    actor = LMActor(
        ScriptedBackend(tok, lambda t, i: scripted_calc(t, i)), CalculatorEnv, SamplingParams(max_new_tokens=64)
    )
    tree = actor.tree(0, task)
    [ep] = actor.start(tree, task, [0])
    actor.begin_step(1, Clock())
    asyncio.run(lockstep(actor, [tree], [ep], [tree.root_id], BARE))  # the engine's episode loop
    prompt_len = len(fmt.prompt_ids(CalculatorEnv().system_prompt(), task["question"]))
    assert ep.done and ep.reward == 1.0 and len(ep.turns) == 4
    assert len(ep.token_ids) == prompt_len + sum(len(t.token_ids) for t in ep.turns)
    messages = [
        {"role": "system", "content": CalculatorEnv().system_prompt()},
        {"role": "user", "content": task["question"]},
    ]
    for t in ep.turns:
        messages.append({"role": "assistant", "content": t.action})
        if not t.done:
            messages.append({"role": "user", "content": "Observation: " + t.observation})
    rendered = tok.apply_chat_template(messages, tokenize=False)
    assert tok.decode(ep.token_ids) + "\n" == rendered  # same text as rendering the whole chat at once
    for t in ep.turns:
        assert t.loss_mask[: len(t.logprobs)] == [1] * len(t.logprobs) and not any(t.loss_mask[len(t.logprobs) :])


def test_template_without_chat_template_is_a_clear_error():
    tok = byte_tokenizer()
    tok.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        ChatFormat(tok)
