"""BFCL multi-turn function calling (base, long_context, miss_func, miss_param) from the `bfcl-eval` package.

Install it with `pip install --no-deps bfcl-eval mpmath` (a plain install pulls a CUDA torch and pins numpy).

An episode walks through the entry's user turns. Within a turn the agent acts with
`Action: call[f(a=1), g(b='x')]` (the calls run in order on this rollout's own backend instances and their
results come back as the observation) and ends the turn with `Action: done[]`; the next user message (or,
in miss_func, the announcement of the functions that come back) is the next observation. Backend instances
are created fresh for every rollout and deep-copied on fork: BFCL's own executor caches instances in module
globals keyed by model name and entry id, which would leak state across rollouts. Calls are parsed with
`ast` and arguments must be literals (nothing is eval'ed). The reward is BFCL's own verdict: its
multi_turn_checker (state and response checks per turn, run under a unique model name whose cached
globals are removed afterwards).

Scoring follows the official runner of the installed bfcl-eval (eval_checker/eval_runner.py,
_evaluate_single_multi_turn_entry): a run that was force-quit before its last turn fails, anything else gets
multi_turn_checker's verdict. The runner stopped calling multi_turn_irrelevance_checker in 2024 (BFCL
changelog), so an extra harmless call in a turn that expects none is valid here as it is there. A turn allows
the runner's step limit (MAXIMUM_STEP_LIMIT, 20): the step after it still runs, then the episode is force-quit,
as the runner does. Functions that miss_func holds back are missing from the prompt until their turn, but
run when called, as in the runner (some ground truths call one early: multi_turn_miss_func_49 calls `tail`).
Calls are read as the runner's prompting decoder (default_decode_execute_prompting) reads them: keyword
arguments only, positional ones dropped (`sort('final_report.pdf')` runs and is scored as `sort()`, and the
observation says so), written back by the package's own decoded_output_to_execution_list. Differences that
remain: the runner ends a turn on output it cannot decode, this environment answers with an error and lets
the agent retry (those steps count towards the limit); the runner's decoder `eval`s arithmetic and lambdas
in arguments, this environment refuses them. Only calls this environment executed are recorded for the
checker, which `eval`s them: calls with non-literal arguments never reach it.

Time and memory: each backend call may take `call_timeout_s` of CPU time, the calls of one step together
STEP_BUDGET times that, scoring SCORE_BUDGET times that (the runner has no limit; `power(base=10,
exponent=10**7)` took 21 s). CPU time, not the wall clock, so whether a call near the limit runs does not depend
on the machine's load (a call that waits without computing is stopped at bounded.WALL_FACTOR times the limit by
the wall clock, as is one left under a quarter of a core by the load; BFCL's backends do not wait). A step's
calls run only in a bounded copy of the backends (`bounded.run_bounded`: a fork of a small worker process that
receives the backends pickled, with CALL_MEMORY_MB of memory to add), never in this process: the copy's results
are the step's results and its backends, pickled back, become this rollout's (so a call that sets module state,
such as mpmath's precision, changes nothing here). A call past its limit is stopped and reported, and the calls
before it run once more in a second copy whose backends are kept (deterministic given their state, which the
copy holds); only such a step runs its calls twice. The backends' pickled state is capped at MAX_STATE_BYTES
(the largest entry starts at 20 KB): a step whose calls would grow it past that has no effect, so a step's cost
stays bounded however long the episode. Scoring runs the checker in a bounded copy too; past its budget the
episode fails (error_type "trace_rl:scoring"). Where fork is unavailable (not Linux or macOS), calls run here,
unbounded.

An action's calls are refused before parsing past MAX_CALLS_CHARS (100,000 characters) or MAX_CALLS_DEPTH (32
nested brackets), far above what a model writes in one turn, so no action costs more than milliseconds to parse.
No action text raises: calls too deeply nested to parse or evaluate, non-literal or unhashable arguments and
backend errors become observations, and the calls' output is capped at `max_observation_chars` (100,000 by
default, above what the long_context backends return by design; one action holding thousands of calls can
produce far more, which the cap cuts).
"""

from __future__ import annotations

import ast
import copy
import importlib
import importlib.util
import inspect
import itertools
import json
import pickle
import re
from dataclasses import dataclass
from functools import partial

from .base import cap_observation, parse_action, tool_failure
from .bfcl_data import CATEGORIES, describe, load_bfcl, official_execution_list, tool_docs
from .bfcl_data import bfcl_root as bfcl_root  # re-exported: callers import BFCL's names from here
from .bounded import run_bounded
from .registry import EnvPlugin, EnvSpec, sample_rows

STEP_LIMIT = 20  # bfcl_eval.constants.default_prompts.MAXIMUM_STEP_LIMIT; BFCLEnv() reads the installed value
TOOLS = ("call", "done")
STEP_BUDGET = 5  # the calls of one step together may take this many times call_timeout_s
CALL_MEMORY_MB = 1024  # memory a step's calls (and scoring) may add in their copy: mpmath at 4e9 digits took 2 GB
MAX_STATE_BYTES = 1 << 20  # the backends' pickled state (the largest entry starts at 20 KB): bounds a step's cost
SCORE_BUDGET = 15  # and the checker's replay of an episode this many times
# An action's calls are bounded before they are parsed (a 13.8 MB action of a million-key dict took 18.6 s and 3 GB
# in ast and its literals): a model's action is at most max_new_tokens long (256 by default, ~1,000 characters;
# 4,096 tokens are ~20,000), and BFCL's arguments nest a few levels (lists of dicts).
MAX_CALLS_CHARS = 100_000
MAX_CALLS_DEPTH = 32  # brackets ( [ { nested in the calls (a call's own count), outside string literals
_STRINGS = re.compile(
    r'"""(?:\\.|[^\\])*?"""' r"|'''(?:\\.|[^\\])*?'''" r'|"(?:\\.|[^"\\\n])*"' r"|'(?:\\.|[^'\\\n])*'"
)
_NOT_BRACKETS = re.compile(r"[^()\[\]{}]+")
_run_ids = itertools.count()
_CHECKER = "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker"


def _call_one(owner, name: str, kwargs: dict) -> str:
    """One backend call and its result as the agent reads it; the backend's own error, as BFCL shows it."""
    try:
        out = getattr(owner, name)(**kwargs)
        return out if isinstance(out, str) else json.dumps(out, default=str)
    except MemoryError:  # in its bounded copy: past CALL_MEMORY_MB
        return f"Error during execution: the call ran out of memory (a step's calls may use {CALL_MEMORY_MB} MiB)"
    except Exception as err:  # noqa: BLE001
        return f"Error during execution: {err}"


def _run_in_copy(tick, instances: dict, calls: list[tuple[str, str, dict]], cap: int) -> tuple[list[str], bytes | int]:
    """Run in a bounded copy: the calls in order on the copy's backends (instances by class name), a tick each;
    their results and the backends' state after them, pickled, or its size when past `cap` bytes."""
    results = []
    for cls, name, kwargs in calls:
        results.append(_call_one(instances[cls], name, kwargs))
        tick()
    state = pickle.dumps(instances, protocol=pickle.HIGHEST_PROTOCOL)
    return results, state if len(state) <= cap else len(state)


def _execute(instances: dict, calls: list, timeout_s: float) -> tuple[list[str], dict | None, str | None]:
    """Run `calls` ((owner, name, kwargs, ...) each) in order in a bounded copy of the backends, the only place
    they run: (the results of the calls that ran, the backends after them or None when unchanged, why the
    rest did not run or None). A call past its limit stops the step; the calls before it then run again in a
    second copy, whose state is kept (the backends are deterministic given their state, which the copy holds)."""
    if not calls:
        return [], None, None
    cls = {id(obj): key for key, obj in instances.items()}
    todo = [(cls[id(owner)], name, kwargs) for owner, name, kwargs, *_ in calls]
    bounds = {"cpu": True, "memory_mb": CALL_MEMORY_MB}
    status, value, done = run_bounded(
        _run_in_copy, (instances, todo, MAX_STATE_BYTES), timeout_s, STEP_BUDGET * timeout_s, **bounds
    )
    if status == "ok":
        results, state = value
        if isinstance(state, int):
            return [], None, f"they would grow the backends' state to {state} bytes (at most {MAX_STATE_BYTES})"
        return results, pickle.loads(state), None
    name = todo[done][1] if status == "timeout" and done < len(todo) else None
    why = (
        f"the call to {name} ran past the {timeout_s:g} s limit of CPU time (the step's calls share "
        f"{STEP_BUDGET * timeout_s:g} s) and was stopped"
        if name
        else f"they failed ({value})"
        if status == "error"
        else "they ran past the step's limit"
    )
    if not name or done == 0:
        return [], None, why
    status, value, _ = run_bounded(
        _run_in_copy, (instances, todo[:done], MAX_STATE_BYTES), timeout_s, STEP_BUDGET * timeout_s, **bounds
    )
    if status != "ok" or isinstance(value[1], int):  # the prefix did not finish again: the step has no effect
        return [], None, why
    return value[0], pickle.loads(value[1]), why


def _check(tick, calls: list, truth: list, entry: dict, category: str, name: str) -> dict:
    """Run in a bounded copy: multi_turn_checker's verdict (its cached globals die with the copy, and are
    removed in case it runs here)."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    try:
        verdict = multi_turn_checker(calls, truth, entry, category, name)
    except Exception as err:  # noqa: BLE001 (the checker asserts on malformed inputs; a failed episode)
        verdict = {"valid": False, "error_message": f"checker error: {err}"}
    finally:
        for key in [k for k in vars(multi_turn_utils) if k.startswith(name)]:
            del vars(multi_turn_utils)[key]
    return {k: v for k, v in verdict.items() if k in ("valid", "error_message", "error_type")}


def check_limits(steps_per_turn: int | None, call_timeout_s: float) -> None:
    """The per-turn step limit (None: the official runner's) and the time one backend call may take."""
    if steps_per_turn is not None and (
        isinstance(steps_per_turn, bool) or not isinstance(steps_per_turn, int) or steps_per_turn < 1
    ):
        raise ValueError(
            f"steps_per_turn must be a positive integer (0 or None: the official runner's), got {steps_per_turn!r}"
        )
    if isinstance(call_timeout_s, bool) or not isinstance(call_timeout_s, (int, float)) or not call_timeout_s > 0:
        raise ValueError(f"call_timeout_s must be a positive number of seconds, got {call_timeout_s!r}")


class BFCLEnv:
    def __init__(
        self, steps_per_turn: int | None = None, max_observation_chars: int = 100_000, call_timeout_s: float = 2.0
    ):
        """steps_per_turn: the per-turn step limit; None means the official runner's (20). call_timeout_s: the
        time one backend call may take, at the step and again at scoring (the official runner has none)."""
        check_limits(steps_per_turn, call_timeout_s)
        self.call_timeout_s = float(call_timeout_s)
        self.steps_per_turn = steps_per_turn or _official_step_limit()
        self.max_observation_chars = max_observation_chars
        self.force_quit = False
        self.task: dict | None = None
        self.done = True

    # -- protocol ---------------------------------------------------------------------------------
    def system_prompt(self) -> str:
        tools = "\n".join(describe(self.docs[n]) for n in sorted(self.visible))
        return (
            "You operate tools for the user. Each user message is a turn: make the calls it needs, then end the "
            "turn. If a request cannot be done with the tools or lacks information, make no call and end the turn.\n"
            "Actions: call[f(a=1), g(b='x')] runs calls in order; done[] ends the turn.\n"
            "Example:\nList the files here.\nAction: call[ls()]\n"
            'Observation: {"current_directory_content": ["a.txt"]}\n'
            f"Action: done[]\nAvailable functions:\n{tools}"
        )

    def reset(self, task: dict) -> str:
        from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

        self.task, self.done, self.force_quit = task, False, False
        self.turn_index, self.steps_in_turn, self.turn = 0, 0, 0
        self.calls: list[list[list[str]]] = [[] for _ in task["question"]]
        long_context = "long_context" in task["category"]
        self.instances = {}
        for cls in task["involved_classes"]:
            obj = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[cls]), cls)()
            if cls not in STATELESS_CLASSES:
                obj._load_scenario(copy.deepcopy(task["initial_config"].get(cls, {})), long_context=long_context)
            self.instances[cls] = obj
        self.docs = tool_docs(task["involved_classes"])
        missed = {n for names in task.get("missed_function", {}).values() for n in names}
        excluded = set(task.get("excluded_function", []))
        self.visible = {n for n in self.docs if n not in missed | excluded}
        # each turn ends at the latest on the step after the limit (the official runner's force quit)
        self.max_turns = len(task["question"]) * (self.steps_per_turn + 1)
        return self._user_turn()

    def _user_turn(self) -> str:
        k = self.turn_index
        for name in self.task.get("missed_function", {}).get(str(k), []):
            self.visible.add(name)
        msgs = self.task["question"][k]
        if msgs:
            return "\n".join(m["content"] for m in msgs)
        added = self.task.get("missed_function", {}).get(str(k), [])
        return "New functions are available: " + "; ".join(describe(self.docs[n]) for n in added)

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self.done or self.task is None:
            raise RuntimeError("step() after the episode ended; call reset() first")
        self.turn += 1
        self.steps_in_turn += 1
        parsed = parse_action(action, TOOLS)
        info = {"valid_action": parsed.tool is not None}
        if parsed.tool == "call":
            try:
                obs, info["valid_action"] = self._run_calls(parsed.argument)
            except Exception as err:  # noqa: BLE001  model text must never crash the trainer; a bug shows in info
                obs, failure = tool_failure(err)
                info.update(failure, valid_action=False)
        elif parsed.tool == "done":
            obs = None
        else:
            obs = parsed.error
        if obs is not None:  # capped before the next user message is added, which is never cut
            obs = cap_observation(obs, self.max_observation_chars)
        if parsed.tool != "done" and self.steps_in_turn > self.steps_per_turn:
            return self._force_quit(obs, info)
        if parsed.tool == "done":
            self.turn_index += 1
            self.steps_in_turn = 0
            if self.turn_index >= len(self.task["question"]):
                self.done = True
                reward, verdict = self.score()
                info["verdict"] = verdict
                return "Episode finished.", reward, True, info
            nxt = self._user_turn()
            obs = nxt if obs is None else f"{obs}\nNext user message: {nxt}"
        return obs, 0.0, False, info

    def fork(self) -> "BFCLEnv":
        twin = copy.copy(self)
        twin.instances = copy.deepcopy(self.instances)
        twin.calls = copy.deepcopy(self.calls)
        twin.visible = set(self.visible)
        return twin

    # -- calls --------------------------------------------------------------------------------------
    def _run_calls(self, text: str) -> tuple[str, bool]:
        too_big = calls_too_big(text)
        if too_big:
            return f"Error: could not parse the calls ({too_big}). Write: call[f(a=1), g(b='x')]", False
        try:
            tree = ast.parse("(" + text + ",)", mode="eval")
            nodes = tree.body.elts if isinstance(tree.body, ast.Tuple) else [tree.body]
            if not nodes or not all(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) for n in nodes):
                raise ValueError("each item must be a call like name(arg=value)")
        except (SyntaxError, ValueError, RecursionError, MemoryError) as err:  # deep nesting: the latter two
            return f"Error: could not parse the calls ({str(err)[:200]}). Write: call[f(a=1), g(b='x')]", False
        plan = [self._decode(node) for node in nodes]  # (owner, name, kwargs, recorded string, note) or an error
        calls = [p for p in plan if not isinstance(p, str)]
        outputs, state, stopped = _execute(self.instances, calls, self.call_timeout_s)
        if state is not None:
            self.instances = state
        results, strings, ok, ran = [], [], stopped is None and len(calls) == len(plan), 0
        for item in plan:
            if isinstance(item, str):
                results.append(item)
                continue
            _, name, _, string, note = item
            if ran < len(outputs):
                strings.append(string)  # recorded for the checker only once it has run
                results.append(outputs[ran] + note)
            elif ran == len(outputs) and stopped.startswith("the call to"):
                results.append(f"Error: {stopped}; it had no effect, the calls after it did not run")
            elif ran == len(outputs):
                results.append(f"Error: the calls from {name} on did not run: {stopped}")
            ran += 1
        if strings:  # the runner drops steps that decode to no call
            self.calls[self.turn_index].append(strings)
        return "\n".join(str(r) for r in results), ok

    def _decode(self, node: ast.Call):
        """A call as the official prompting decoder keeps it (keyword arguments only, formatted by its own
        decoded_output_to_execution_list), with its literal arguments; or an error message."""
        name = node.func.id
        # functions hidden in miss_func are left out of the prompt but run when called, as in the runner
        owner = next(
            (
                o
                for o in self.instances.values()
                if hasattr(o, name) and not name.startswith("_") and inspect.ismethod(getattr(o, name))
            ),
            None,
        )
        if owner is None:
            return f"Error: no function named {name!r} is available"
        try:
            if any(k.arg is None for k in node.keywords):
                raise ValueError("**kwargs")
            kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
            string = official_execution_list()([{name: kwargs}])[0]
            decoded = ast.parse(string, mode="eval").body  # what the runner executes: the formatted call
            kwargs = {k.arg: ast.literal_eval(k.value) for k in decoded.keywords}
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError, AttributeError):
            return f"Error: arguments of {name} must be literal values passed by name"
        note = (
            f"\n(Note: {name}'s positional arguments were dropped, as BFCL's decoder drops them.)" if node.args else ""
        )
        return owner, name, kwargs, string, note

    def _force_quit(self, obs: str, info: dict) -> tuple[str, float, bool, dict]:
        """The runner's answer to a turn past the step limit: stop the episode here and score what was done."""
        self.done = self.force_quit = True
        reward, info["verdict"] = self.score()
        note = f"Forced to quit after {self.steps_per_turn} steps in one turn. Episode finished."
        return f"{obs}\n{note}", reward, True, info

    def score(self) -> tuple[float, dict]:
        """BFCL's verdict on this episode's calls, by the official runner's path (see the module docstring)."""
        truth = self.task["answer"]
        calls = self.calls[: self.turn_index + 1] if self.force_quit else self.calls
        if len(calls) != len(truth):
            message = f"force-quit in turn {len(calls) - 1} of {len(truth)}"
            return 0.0, {"valid": False, "error_type": "multi_turn:force_terminated", "error_message": message}
        name = f"trace_rl_run{next(_run_ids)}"
        entry = {k: self.task[k] for k in ("id", "initial_config", "involved_classes")}
        # the checker runs every recorded call and every ground-truth call again (milliseconds for a real episode)
        limit = SCORE_BUDGET * self.call_timeout_s
        args = (calls, truth, entry, self.task["category"], name)
        bounds = {"cpu": True, "memory_mb": CALL_MEMORY_MB}
        status, verdict, _ = run_bounded(_check, args, limit, preload=(_CHECKER,), **bounds)
        if status != "ok":
            what = f"ran past its {limit:g} s limit" if status == "timeout" else f"failed ({verdict})"
            verdict = {"valid": False, "error_type": "trace_rl:scoring", "error_message": f"scoring {what}"}
        return float(bool(verdict["valid"])), verdict


def calls_too_big(text: str) -> str | None:
    """Why the calls `text` are refused before parsing (longer than MAX_CALLS_CHARS, or brackets nested deeper
    than MAX_CALLS_DEPTH outside string literals), or None. Linear in the text: two regular expressions and a
    count, milliseconds at the bound."""
    if len(text) > MAX_CALLS_CHARS:
        return f"{len(text):,} characters, over the {MAX_CALLS_CHARS:,} the calls of one action may hold"
    depth = deepest = 0
    for c in _NOT_BRACKETS.sub("", _STRINGS.sub("", text)):
        depth += 1 if c in "([{" else -1
        deepest = max(deepest, depth)
    if deepest > MAX_CALLS_DEPTH:
        return f"brackets nested {deepest} deep, over the {MAX_CALLS_DEPTH} the calls of one action may use"
    return None


def _official_step_limit() -> int:
    try:
        from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT
    except ImportError:  # the environment cannot run without bfcl-eval; reset() says so
        return STEP_LIMIT
    return int(MAXIMUM_STEP_LIMIT)


def keyword_form(call: str, env: BFCLEnv) -> str:
    """`call` with its positional arguments passed by name (from the backend method's signature), the form the
    official prompting decoder keeps whole; 24 of the 200 multi_turn_base ground truths need it."""
    node = ast.parse(call, mode="eval").body
    if not node.args:
        return call
    owner = next(o for o in env.instances.values() if hasattr(o, node.func.id))
    names = [p for p in inspect.signature(getattr(owner, node.func.id)).parameters if p != "self"]
    node.keywords = [ast.keyword(arg=n, value=v) for n, v in zip(names, node.args)] + node.keywords
    node.args = []
    return ast.unparse(node)


def replay_ground_truth(task: dict, corrupt: bool = False) -> float:
    """Run the ground-truth calls, in keyword form, through a fresh env (optionally with the last call of the
    first non-empty turn dropped) and return BFCL's verdict; used to show the env and the checker agree."""
    env = BFCLEnv()
    env.reset(task)
    corrupted = False
    reward = 0.0
    for calls in task["answer"]:
        if calls:
            if corrupt and not corrupted:
                calls, corrupted = calls[:-1], True
            if calls:
                env.step("Action: call[" + ", ".join(keyword_form(c, env) for c in calls) + "]")
        _, reward, done, _ = env.step("Action: done[]")
        if done:
            break
    return reward


@dataclass
class BFCLSettings:
    """How long an episode may run and a backend call may take."""

    steps_per_turn: int = 0  # the agent's steps in one user turn before it is forced on; 0: the official runner's
    call_timeout_s: float = 2.0  # CPU seconds one backend call may take, at the step and at scoring

    def __post_init__(self):
        check_limits(self.steps_per_turn or None, self.call_timeout_s)


def bfcl_spec(settings: BFCLSettings) -> EnvSpec:
    """BFCL has no training split: training draws from the base category, so evaluate on the others."""
    return EnvSpec(
        partial(BFCLEnv, steps_per_turn=settings.steps_per_turn or None, call_timeout_s=settings.call_timeout_s),
        {c: (lambda n, c=c: load_bfcl(c, n)) for c in CATEGORIES},
        sample_rows(lambda: load_bfcl("multi_turn_base")),
        max_new_tokens=256,
    )


BFCL = EnvPlugin("bfcl", bfcl_spec, BFCLSettings)
