"""The `trace-rl` command line: `trace-rl CMD [--config FILE.yaml] [key=value ...]`.

`COMMANDS` is the public command table: per command, its config class and its runner, `run(cfg, yaml_text) ->
summary`, both named as 'module:attr' and imported only when the command runs (so `--help` of one command never
loads another's layers). The runners live in `commands/` (one module per command), except `sft`, whose layer's
own runner already has that signature; `compare` runs its runs through `train`'s or `rollout`'s runner. This
module is the dispatcher only: parse the keys into the typed config (`config.py`), check that `out` can be
created (without creating it), run the probes once, call the runner, which creates `out` once its own checks
have passed, so a refused command leaves nothing behind. Every user error (`errors.UserError`) is one line
naming the setting, exit code 2, before any work starts where it can be known then; any other exception is a
bug and keeps its traceback (exit code 1)."""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .config import help_text, load_config
from .errors import ConfigError, UserError
from .stack.config import LMPolicyConfig


@dataclass(frozen=True)
class Command:
    """One command of the table: where its settings and its runner are, which key bare words fill, its help."""

    config: str  # the config dataclass, 'module:Class'
    run: str  # the runner, 'module:function': run(cfg, yaml_text) -> summary
    help: str  # the line `trace-rl --help` shows
    positional: str | None = None  # the key that bare words fill (`trace-rl view A.jsonl B.jsonl`)

    def config_class(self) -> type:
        return _load(self.config)

    def runner(self):
        return _load(self.run)


COMMANDS: dict[str, Command] = {
    "train": Command(
        "trace_rl.train.trainer:TrainConfig",
        "trace_rl.commands.train:run",
        "train an LM agent with TRACE (the main job; tiny CPU policy by default)",
    ),
    "compare": Command(
        "trace_rl.commands.compare:CompareConfig",
        "trace_rl.commands.compare:run",
        "seeds x methods over train (default) or rollout at equal budget, paired by seed; table and plots",
    ),
    "simulate": Command(
        "trace_rl.testbed.simulate:SimulateConfig",
        "trace_rl.commands.simulate:run",
        "compare methods on the synthetic testbed at equal budget",
    ),
    "sft": Command(
        "trace_rl.train.sft:SFTConfig",
        "trace_rl.train.sft:run_sft",
        "warm-start a policy on the built-in task's demonstrations and cache it",
    ),
    "rollout": Command(
        "trace_rl.commands.rollout:RolloutConfig",
        "trace_rl.commands.rollout:run",
        "grow trees from a frozen policy with several methods",
    ),
    "methods": Command(
        "trace_rl.commands.methods:MethodsConfig",
        "trace_rl.commands.methods:run",
        "every method with its status, what it changes and when to use it (stable first)",
    ),
    "eval": Command(
        "trace_rl.commands.eval:EvalConfig",
        "trace_rl.commands.eval:run",
        "accuracy of a model on an environment's benchmarks",
    ),
    "view": Command(
        "trace_rl.commands.view:ViewConfig",
        "trace_rl.commands.view:run",
        "write an HTML page that shows each prompt's tree",
        positional="trees",
    ),
    "diagnose": Command(
        "trace_rl.commands.diagnose:DiagnoseConfig",
        "trace_rl.commands.diagnose:run",
        "predictor quality by depth for a run",
        positional="run_dir",
    ),
    "report": Command(
        "trace_rl.commands.report:ReportConfig",
        "trace_rl.commands.report:run",
        "every published table and figure, from the stored runs (results/); keep=DIR stores a study",
    ),
    "serve-retriever": Command(
        "trace_rl.commands.serve_retriever:ServeRetrieverConfig",
        "trace_rl.commands.serve_retriever:run",
        "a Search-R1-compatible /retrieve server",
    ),
    "fetch-data": Command(
        "trace_rl.envs.data_fetch:FetchDataConfig",
        "trace_rl.commands.fetch_data:run",
        "download the math and QA data sets (pinned, SHA-256 checked)",
    ),
    "verl-data": Command(
        "trace_rl.integrations.verl.data:VerlDataConfig",
        "trace_rl.commands.verl_data:run",
        "verl's parquet rows",
    ),
    "propositions": Command(
        "trace_rl.commands.propositions:PropositionsConfig",
        "trace_rl.commands.propositions:run",
        "check the paper's Propositions 1 and 2",
    ),
}


def _load(spec: str):
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def _check_out(cfg) -> None:
    """The run directory can be created, checked without creating it (before any work, so a bad `out` never
    costs a run; and nothing is written before every check has passed, so a refused command leaves nothing
    behind: the runner creates `out` once it starts its work). Checked: the deepest part of the path that exists
    is a directory this process may write to; for a page (`view`'s out.html), the same of its folder."""
    out = getattr(cfg, "out", "")
    if not out:
        return
    what = "the file" if out.endswith(".html") else "the directory"
    there = Path(out).parent if out.endswith(".html") else Path(out)
    while not there.exists() and not there.is_symlink() and there != there.parent:
        there = there.parent
    if not there.is_dir():
        raise ConfigError(f"out: cannot create {what} {out!r} ({there} is not a directory)")
    if not os.access(there, os.W_OK | os.X_OK):
        raise ConfigError(f"out: cannot create {what} {out!r} (no permission to write in {there})")


RUN_DIRECTORY_COMMANDS = ("train", "compare", "rollout", "simulate", "eval")  # their `out` is a run directory


def _run_lock(command: str, cfg):
    """The run directory's one-writer lock (`rollout.run_lock`) for a command that writes one; a second run on the
    same `out` is refused in one line naming the first. Nothing to hold for other commands or an empty `out`."""
    out = getattr(cfg, "out", "")
    if command not in RUN_DIRECTORY_COMMANDS or not out:
        return contextlib.nullcontext()
    from .rollout.run_lock import run_lock

    return run_lock(out, f"trace-rl {command}")


def _probe(cfg) -> None:
    """An LM command's probes (the server answers, the model can load: `stack.build.probe_policy`; VIP's encoder
    is installed: `predictors.build.probe_predictor`), once, before any work. The configs are plain data, so
    building them (--help, compare's per-run configs) never probes; a command's own probe (serve-retriever's
    dense encoder) runs first thing in its runner."""
    group = getattr(cfg, "shared", None) or cfg  # compare: the settings every run shares
    policy = getattr(group, "policy", None)
    if isinstance(policy, LMPolicyConfig):
        from .predictors.build import probe_predictor
        from .stack.build import probe_policy
        from .trace_config import method_spec

        probe_policy(policy)
        methods = getattr(cfg, "methods", None) or [getattr(group, "method", "")]
        probe_predictor(getattr(group, "predictor", None), [method_spec(m)[0] for m in methods])


def _too_long(err: OSError, argv: list[str]) -> str:
    """One line for a path the system refuses as too long (ENAMETOOLONG), naming the setting that holds it."""
    name = os.fsdecode(err.filename or "")
    key = next(
        (k for k, _, v in (a.partition("=") for a in argv) if v and (v in name or name in v)),
        "--config" if "--config" in argv and name in argv else "a path",
    )
    return (
        f"{key}: a path of {len(os.fsencode(name)):,} bytes that the file system refuses as too long (a name in it "
        "is at most 255 bytes on most, a path 4,096)"
    )


def _usage(commands: dict[str, Command]) -> str:
    lines = ["usage: trace-rl COMMAND [--config FILE.yaml] [key=value ...]   (trace-rl COMMAND --help lists keys)", ""]
    lines += [f"  {name:<16} {c.help}" for name, c in commands.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = COMMANDS
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage(commands))
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in commands:
        print(f"trace-rl: error: unknown command {command!r}; choose from {', '.join(commands)}", file=sys.stderr)
        return 2
    spec = commands[command]
    positional = spec.positional
    try:
        cls = spec.config_class()
    except ImportError as err:
        print(f"trace-rl {command}: error: needs a package that is not installed ({err})", file=sys.stderr)
        return 2
    if "-h" in rest or "--help" in rest:
        try:  # the keys of the env chosen there (`env=math --help`)
            print(help_text(cls, command, [a for a in rest if a not in ("-h", "--help")]))
        except UserError as err:
            print(f"trace-rl {command}: error: {' '.join(str(err).split())}", file=sys.stderr)
            return 2
        return 0
    if positional:  # bare words that are not a flag's value
        bare = [
            i
            for i, a in enumerate(rest)
            if "=" not in a
            and not a.startswith("-")
            and not (i > 0 and rest[i - 1].startswith("--") and "=" not in rest[i - 1])
        ]
        if bare:
            value = ",".join(rest[i] for i in bare)
            rest = [a for i, a in enumerate(rest) if i not in bare] + [f"{positional}={value}"]
    try:
        cfg, yaml_text = load_config(cls, rest)
        _check_out(cfg)  # checks only: every refusal comes before anything is written
        _probe(cfg)
        with _run_lock(command, cfg):
            spec.runner()(cfg, yaml_text)
    except UserError as err:  # anything else is a bug in trace-rl: it keeps its traceback (exit code 1)
        print(f"trace-rl {command}: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:
        if not err.name or err.name.split(".")[0] == "trace_rl":
            raise
        print(f"trace-rl {command}: error: needs the package {err.name!r}, which is not installed", file=sys.stderr)
        return 2
    except OSError as err:
        if err.errno != errno.ENAMETOOLONG:  # any other is a bug, or the machine's: it keeps its traceback
            raise
        print(f"trace-rl {command}: error: {_too_long(err, rest)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        said = "stopped" if command == "serve-retriever" else "interrupted; what was written so far is kept"
        print(f"trace-rl {command}: {said}", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
