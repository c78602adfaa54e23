import numpy as np
import pytest

from trace_rl.envs.base import parse_action
from trace_rl.envs.calculator import CalculatorEnv, make_task, make_tasks, safe_eval, solve


def test_scripted_solver_scores_one_and_wrong_answer_zero():
    for task in make_tasks(50, seed=0, steps=(1, 2, 3, 4, 5), digits=(1, 2, 3)):
        env = CalculatorEnv()
        env.reset(task)
        for action in solve(task):
            obs, reward, done, _ = env.step(action)
        assert done and reward == 1.0
        env.reset(task)
        for action in solve(task)[:-1]:
            env.step(action)
        assert env.step(f"Action: answer[{int(task['answer']) + 1}]")[1] == 0.0


def test_fork_is_independent():
    task = make_task(np.random.default_rng(1), 3, 1)
    env = CalculatorEnv()
    env.reset(task)
    env.step(solve(task)[0])
    a, b = env.fork(), env.fork()
    for action in solve(task)[1:]:
        a.step(action)
    assert a.done and not env.done and not b.done
    assert (env.turn, env.calls) == (b.turn, b.calls) == (1, 1)
    b.step("Action: answer[0]")
    assert b.done and not env.done and env.turn == 1


def test_bad_output_becomes_observation_and_turn_limit_ends_episode():
    task = make_task(np.random.default_rng(2), 1, 1)
    env = CalculatorEnv()
    env.reset(task)
    obs = [env.step(a)[0] for a in ["hello", "Action: search[x]", "Action: calc[os.system(1)]"]]
    assert obs[0].startswith("Invalid action format") and "Unknown tool 'search'" in obs[1]
    assert obs[2].startswith("Error:")
    obs, reward, done, _ = env.step("Action: calc[1+1]")
    assert done and reward == 0.0 and "Turn limit" in obs


def test_safe_eval_and_parse_action():
    assert safe_eval("(2+3)*-4") == -20
    for bad in ["2**100", "__import__('os')", "1/2", "9" * 70]:
        with pytest.raises(ValueError):
            safe_eval(bad)
    p = parse_action("Thought: add them\nAction: calc[1+2]", ("calc", "answer"))
    assert (p.thought, p.tool, p.argument) == ("add them", "calc", "1+2")
    assert parse_action("Action: calc 1+2", ("calc",)).tool is None


def test_a_rows_system_message_is_kept_before_the_tool_instructions():
    from trace_rl.envs.calculator import CalculatorEnv, make_tasks

    env = CalculatorEnv()
    task = {**make_tasks(1, seed=0)[0], "system": "You are a careful assistant."}
    env.reset(task)
    prompt = env.system_prompt()
    assert prompt.startswith("You are a careful assistant.") and prompt.endswith(CalculatorEnv.system)
    env.reset(make_tasks(1, seed=0)[0])
    assert env.system_prompt() == CalculatorEnv.system


def test_model_text_that_is_not_arithmetic_is_refused_without_a_parser_warning():
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # a SyntaxWarning on stderr would interleave with every progress line
        for text in ("12x", "3 4", "3and 4", "1or 2", "5in 3"):
            with pytest.raises(ValueError):
                safe_eval(text)
    assert [str(w.message) for w in caught] == []
