import ast
import collections
import itertools

import pytest

pytest.importorskip("bfcl_eval")

from trace_rl.envs.bfcl_env import CATEGORIES, BFCLEnv, bfcl_root, load_bfcl, replay_ground_truth  # noqa: E402


@pytest.mark.parametrize("category", CATEGORIES)
def test_ground_truth_replays_valid_and_corruption_does_not(category):
    entries = load_bfcl(category)
    assert len(entries) == 200
    assert all(replay_ground_truth(e) == 1.0 for e in entries)
    assert all(replay_ground_truth(e, corrupt=True) == 0.0 for e in entries[:40])


def test_fork_isolates_backend_state_and_bad_calls_are_observations():
    entry = load_bfcl("multi_turn_base", limit=1)[0]
    env = BFCLEnv()
    env.reset(entry)
    twin = env.fork()
    twin.step("Action: call[mkdir(dir_name='only_in_twin')]")
    obs, *_ = env.step("Action: call[ls()]")
    assert "only_in_twin" not in obs
    assert "only_in_twin" in twin.step("Action: call[ls()]")[0]
    assert "could not parse" in env.step("Action: call[ls(]")[0]
    assert "no function named 'rm_rf'" in env.step("Action: call[rm_rf()]")[0]
    assert "must be literal" in env.step("Action: call[cd(folder=open('x'))]")[0]


def test_miss_func_hides_then_reveals_functions():
    entry = load_bfcl("multi_turn_miss_func", limit=1)[0]
    env = BFCLEnv()
    env.reset(entry)
    ((turn, names),) = entry["missed_function"].items()
    assert not set(names) & env.visible
    for _ in range(int(turn)):
        env.step("Action: done[]")
    assert set(names) <= env.visible


# -- the official runner's verdicts on perturbed trajectories ------------------------------------------------------
def official_decoder():
    """bfcl-eval's default_decode_execute_prompting, the prompting runner's decoder, taken from the installed
    source with the functions it calls (its module imports tree_sitter and provider SDKs at import time). It
    `eval`s arithmetic in arguments, so it only ever sees the data set's own calls here."""
    from bfcl_eval.constants.enums import ReturnFormat

    path = bfcl_root() / "model_handler" / "utils.py"
    wanted = {
        "default_decode_execute_prompting",
        "ast_parse",
        "resolve_ast_call",
        "resolve_ast_by_type",
        "decoded_output_to_execution_list",
        "parse_nested_value",
    }
    nodes = [n for n in ast.parse(path.read_text()).body if getattr(n, "name", "") in wanted]
    assert {n.name for n in nodes} == wanted
    namespace = {"ast": ast, "re": __import__("re"), "ReturnFormat": ReturnFormat}
    exec(compile(ast.Module(nodes, []), str(path), "exec"), namespace)  # noqa: S102 (the package's own code)
    return namespace["default_decode_execute_prompting"]


def uses_positional(entry: dict) -> bool:
    return any(ast.parse(c, mode="eval").body.args for turn in entry["answer"] for c in turn)


# bfcl_eval's eval_runner module imports every provider SDK at import time, so its entry-level scorer is taken from
# the installed source and run as it is, with the names it uses; the test therefore follows the installed version.
HARMLESS = {  # a read-only call per backend class
    "GorillaFileSystem": "pwd()",
    "MathAPI": "absolute_value(number=-2)",
    "MessageAPI": "list_users()",
    "TwitterAPI": "posting_get_login_status()",
    "TicketAPI": "ticket_get_login_status()",
    "TradingBot": "get_current_time()",
    "TravelAPI": "travel_get_login_status()",
    "VehicleControlAPI": "get_current_speed()",
}
_oracle_runs = itertools.count()


@pytest.fixture(scope="module")
def official_scorer():
    from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker as checker_module
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    source = (bfcl_root() / "eval_checker" / "eval_runner.py").read_text()
    (node,) = [n for n in ast.parse(source).body if getattr(n, "name", "") == "_evaluate_single_multi_turn_entry"]
    namespace = {
        "multi_turn_checker": checker_module.multi_turn_checker,
        "is_empty_execute_response": multi_turn_utils.is_empty_execute_response,
        "BaseHandler": object,
    }  # only its annotation names it
    exec(compile(ast.Module([node], []), "eval_runner.py", "exec"), namespace)  # noqa: S102 (the package's own code)
    evaluate = namespace["_evaluate_single_multi_turn_entry"]
    decode = official_decoder()

    class Prompting:  # the runner's handler for prompting models: each step's text goes through its decoder
        @staticmethod
        def decode_execute(result, has_tool_call_tag):
            return decode(result, has_tool_call_tag)

    def score(entry: dict, trajectory: list[list[list[str]]]) -> bool:
        results = []
        for steps in trajectory:  # the inference loop: past the step limit the run is force-quit
            # what a prompting model writes in a step: a bracketed list of calls, decoded by the runner
            results.append(["[" + ", ".join(calls) + "]" for calls in steps[: MAXIMUM_STEP_LIMIT + 1]])
            if len(steps) > MAXIMUM_STEP_LIMIT:
                break
        name = f"official_oracle{next(_oracle_runs)}"
        prompt = {k: entry[k] for k in ("id", "initial_config", "involved_classes")}
        try:
            return evaluate(Prompting, entry["id"], results, entry["answer"], prompt, name, entry["category"])["valid"]
        finally:
            for key in [k for k in vars(multi_turn_utils) if k.startswith(name)]:
                del vars(multi_turn_utils)[key]

    return score


def env_verdict(entry: dict, trajectory: list[list[list[str]]]) -> bool:
    env = BFCLEnv()
    env.reset(entry)
    for steps in trajectory:
        for calls in steps:
            _, reward, done, _ = env.step("Action: call[" + ", ".join(calls) + "]")
            if done:
                return reward == 1.0
        _, reward, done, _ = env.step("Action: done[]")
        if done:
            return reward == 1.0
    raise AssertionError("the episode did not end with its last turn")


def perturbations(entry: dict) -> dict[str, list[list[list[str]]]]:
    truth = entry["answer"]
    gt = [[calls] if calls else [] for calls in truth]
    harmless = HARMLESS[entry["involved_classes"][0]]
    first = next(i for i, calls in enumerate(truth) if calls)
    out = {"ground truth": gt, "one call per step": [[[c] for c in calls] for calls in truth]}
    out["extra harmless call in the last turn"] = gt[:-1] + [gt[-1] + [[harmless]]]
    dropped = [list(steps) for steps in gt]
    dropped[first] = [truth[first][:-1]] if len(truth[first]) > 1 else []
    out["last call of the first busy turn dropped"] = dropped
    if len(truth) > 1:
        out["first turn's calls made a turn late"] = [[]] + [gt[0] + gt[1]] + gt[2:]
    if "GorillaFileSystem" in entry["involved_classes"]:
        out["extra mkdir in the first turn"] = [gt[0] + [["mkdir(dir_name='trace_rl_extra')"]]] + gt[1:]
    out["21 steps in the first turn"] = [[[harmless]] * 20 + gt[0]] + gt[1:]
    out["20 steps in the first turn"] = [[[harmless]] * 19 + gt[0]] + gt[1:]
    return out


@pytest.mark.parametrize("category", CATEGORIES)
def test_verdicts_equal_the_official_runner_on_perturbed_trajectories(category, official_scorer):
    seen = collections.Counter()
    for entry in load_bfcl(category, limit=12):
        for label, trajectory in perturbations(entry).items():
            official = official_scorer(entry, trajectory)
            assert env_verdict(entry, trajectory) == official, (entry["id"], label)
            seen[official] += 1
    assert seen[True] and seen[False]  # both verdicts occur, so the comparison can tell them apart


@pytest.mark.parametrize("category", ["multi_turn_miss_func", "multi_turn_miss_param"])
def test_a_harmless_call_in_the_turn_without_expected_calls_is_valid_as_officially(category, official_scorer):
    for entry in [e for e in load_bfcl(category) if not uses_positional(e)]:  # those fail as written (below)
        empty = next(i for i, calls in enumerate(entry["answer"]) if not calls)
        trajectory = [[calls] if calls else [] for calls in entry["answer"]]
        trajectory[empty] = [[HARMLESS[entry["involved_classes"][0]]]]
        assert env_verdict(entry, trajectory) == official_scorer(entry, trajectory) is True, entry["id"]


def test_step_limit_is_the_official_one_and_force_quit_fails_the_run():
    entry = load_bfcl("multi_turn_base", limit=1)[0]
    env = BFCLEnv()
    env.reset(entry)
    assert env.steps_per_turn == 20
    for _ in range(20):
        assert env.step("Action: call[pwd()]")[2] is False
    obs, reward, done, info = env.step("Action: call[pwd()]")
    assert done and reward == 0.0 and info["verdict"]["error_type"] == "multi_turn:force_terminated"
    assert "Forced to quit after 20 steps" in obs
    with pytest.raises(ValueError, match="steps_per_turn"):
        BFCLEnv(steps_per_turn=0)


def test_calls_with_non_literal_arguments_never_reach_the_checker(tmp_path):
    entry = load_bfcl("multi_turn_base", limit=1)[0]
    env = BFCLEnv()
    env.reset(entry)
    marker = tmp_path / "ran"
    env.step(f"Action: call[mkdir(dir_name=open({str(marker)!r}, 'w').name)]")
    env.step("Action: call[no_such_function()]")
    assert env.calls[0] == []
    for _ in entry["question"]:
        *_, done, _ = env.step("Action: done[]")
    assert done and not marker.exists()


# -- positional arguments, as the official prompting decoder reads them -----------------------------------------------
def test_the_official_decoder_drops_positional_arguments_and_so_does_the_env(official_scorer):
    assert official_decoder()("[sort('final_report.pdf'), cd(folder='x')]") == ["sort()", "cd(folder='x')"]
    entries = load_bfcl("multi_turn_base")
    positional = [e for e in entries if uses_positional(e)]
    assert len(positional) == 24  # of the 200 ground truths
    for entry in positional + [e for e in entries if not uses_positional(e)][:24]:
        raw = [[calls] if calls else [] for calls in entry["answer"]]
        official = official_scorer(entry, raw)
        assert env_verdict(entry, raw) == official, entry["id"]
        assert official is not uses_positional(entry), entry["id"]  # dropped arguments fail the run
    env = BFCLEnv()
    env.reset(positional[0])
    call = next(c for turn in positional[0]["answer"] for c in turn if ast.parse(c, mode="eval").body.args)
    obs = env.step(f"Action: call[{call}]")[0]
    assert "positional arguments were dropped" in obs
    assert env.calls[0][-1] == official_decoder()(f"[{call}]")


# -- tool calls of unbounded cost --------------------------------------------------------------------------------------
def test_a_call_of_unbounded_cost_is_cut_off_at_the_step_and_at_scoring():
    import time

    entry = next(e for e in load_bfcl("multi_turn_base") if e["id"] == "multi_turn_base_15")
    assert "MathAPI" in entry["involved_classes"]
    env = BFCLEnv(call_timeout_s=1.0)
    env.reset(entry)
    start = time.monotonic()
    obs, _, done, info = env.step("Action: call[pwd(), power(base=10, exponent=1000000000), pwd()]")
    assert time.monotonic() - start < 10 and not done and not info["valid_action"]
    assert "power ran past the 1 s limit of CPU time" in obs
    assert env.calls[0] == [["pwd()"]]  # the stopped call is not kept
    # a call that would run long only at scoring (recorded here by hand) cannot hold the checker either
    env.calls[0].append(["power(base=10, exponent=1000000000)"])
    env.call_timeout_s = 0.2  # scoring's budget is SCORE_BUDGET (15) times this: 3 s rather than 15
    start = time.monotonic()
    reward, verdict = env.score()
    assert time.monotonic() - start < 60 and reward == 0.0
    assert verdict["error_type"] == "trace_rl:scoring" and "limit" in verdict["error_message"]
    with pytest.raises(ValueError, match="call_timeout_s"):
        BFCLEnv(call_timeout_s=0)


def _math_entry() -> dict:
    return next(e for e in load_bfcl("multi_turn_base") if "MathAPI" in e["involved_classes"])


def test_calls_run_only_in_the_bounded_copy_and_its_result_is_the_result(monkeypatch):
    import mpmath
    from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.math_api import MathAPI

    def here(*args, **kwargs):
        raise AssertionError("a BFCL call ran in the trainer's process")

    env = BFCLEnv()
    env.reset(_math_entry())
    dps = mpmath.mp.dps
    monkeypatch.setattr(MathAPI, "logarithm", here)  # this process only: the worker imports its own MathAPI
    obs, *_ = env.step("Action: call[logarithm(value=1, base=1, precision=1000000000)]")
    assert obs.startswith('{"error"') and mpmath.mp.dps == dps  # before, it left mp.dps = 1e9 here
    assert env.step("Action: call[logarithm(value=8, base=2, precision=10)]")[0] == '{"result": "3.0"}'
    # the copy's backends come back: a change one step makes is there at the next
    env.reset(load_bfcl("multi_turn_base", limit=1)[0])
    env.step("Action: call[mkdir(dir_name='made_in_the_copy')]")
    assert "made_in_the_copy" in env.step("Action: call[ls()]")[0]


def test_a_call_is_bounded_in_memory_as_well_as_time():
    env = BFCLEnv()
    env.reset(_math_entry())
    obs, *_ = env.step("Action: call[square_root(number=2, precision=4000000000)]")
    assert "ran out of memory" in obs or "was stopped" in obs  # before: 2 GB in the copy, then again here


def test_the_backends_state_is_capped_so_a_step_costs_no_more_as_the_episode_grows(monkeypatch):
    from trace_rl.envs import bfcl_env

    monkeypatch.setattr(bfcl_env, "MAX_STATE_BYTES", 64 << 10)  # 1 MiB by default; the largest entry starts at 20 KB
    env = BFCLEnv(steps_per_turn=50)
    env.reset(load_bfcl("multi_turn_base", limit=1)[0])
    before = env.step("Action: call[ls()]")[0]
    touches = ", ".join(f"touch(file_name='{'f' * 200}{i}')" for i in range(400))
    obs, _, _, info = env.step(f"Action: call[{touches}]")
    assert "would grow the backends' state" in obs and not info["valid_action"]
    assert env.step("Action: call[ls()]")[0] == before and env.calls[0] == [["ls()"], ["ls()"]]  # no effect
    assert "error" not in env.step("Action: call[touch(file_name='one_more')]")[0].lower()


def test_calls_past_the_size_or_depth_bound_are_refused_before_parsing(monkeypatch):
    from trace_rl.envs import bfcl_env

    entry = load_bfcl("multi_turn_base", limit=1)[0]
    env = BFCLEnv()
    env.reset(entry)
    at_bound = "cd(folder=" + "[" * (bfcl_env.MAX_CALLS_DEPTH - 1) + "]" * (bfcl_env.MAX_CALLS_DEPTH - 1) + ")"
    strings = "cd(folder='" + "(" * 100 + '\' + "[\\"{{")'  # brackets inside string literals do not count
    assert bfcl_env.calls_too_big(at_bound) is None and bfcl_env.calls_too_big(strings) is None
    a_million_keys = "cd(folder={" + ",".join(f"'k{i}': {i}" for i in range(10_000)) + "})"  # the issue's, smaller
    too_deep = "cd(folder=" + "[" * bfcl_env.MAX_CALLS_DEPTH + "]" * bfcl_env.MAX_CALLS_DEPTH + ")"

    def parse(*args, **kwargs):
        raise AssertionError("parsed")

    monkeypatch.setattr(bfcl_env.ast, "parse", parse)
    for calls, said in (
        (a_million_keys, "over the 100,000"),
        (too_deep, f"nested {bfcl_env.MAX_CALLS_DEPTH + 1} deep"),
    ):
        obs, reward, done, info = env.step(f"Action: call[{calls}]")
        assert obs.startswith("Error: could not parse the calls") and said in obs, obs[:200]
        assert not info["valid_action"] and not done
    monkeypatch.undo()
    assert "could not parse" not in env.step(f"Action: call[{at_bound}]")[0]  # it runs (and the backend says no)
