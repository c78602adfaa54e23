"""`trace-rl compare`: seeds x methods over one command, paired by (warm start, seed), at equal budget.

`command` names what each run is, and its settings are the group of that name, shared by every run but for
what compare sets per run (`SET_PER_RUN`: where it writes, its seed, its method):

- `train` (the default): one training run per method and pair; the table reads held-out accuracy at equal
  rollouts and tokens, the chain and the costs to GRPO's final accuracy (`train.compare`, whose docstring lists
  the figures).
- `rollout`: one `trace-rl rollout` run per method and pair from the frozen policy, no update; the table reads
  effective ratio, contrast groups per 1k rollouts and flips per continuation, each over seeds and paired with
  GRPO's on the same seed (`rollout.report.summarize_over_seeds`). A method here is a name alone: without an
  update there is no advantage estimator to pick.

Each run is the command's own runner (`commands.train.run`, `commands.rollout.run`: the runners of the command
table) on its config, in out/<method>/<pair> (`train.compare.run_dir_name`, `pair_name`); its settings are kept
beside it (run_settings.json): a finished run of the same settings is read, not rerun, a run of other settings
is refused, and the table covers every finished run of the listed methods under `out`, seeds beyond those listed
included. Runs go pair by pair (every method of seed 0, then seed 1, ...), so a study stopped part-way holds
complete pairs. `workers=2` runs two at once, each in its own process with half the cores' torch threads: on a
small machine and the tiny model one thread per run uses the cores better than two threads for one run. The
warm starts (tiny@W) are built first, once each.

`simulate` is not a command here: it loops methods x seeds itself, in one process, with its own seed statistics
(`trace-rl simulate seeds=...`), so routing it through compare would only add indirection.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ..errors import ConfigError, UserError
from ..safe_read import read_json
from ..stack.config import check_seed
from ..trace_config import check_advantage, check_methods
from ..train import compare as train_study
from ..train.compare import DEFAULT_METHODS, open_run, pair_name, parse_method, parse_pair, run_dir_name
from ..train.trainer import TrainConfig
from . import rollout as rollout_command
from . import train as train_command
from .rollout import RolloutConfig

# what `simulate` users get told: the one command with methods x seeds of its own
NOT_HERE = {"simulate": "simulate runs methods x seeds itself: trace-rl simulate methods=... seeds=..."}


@dataclass
class CompareSettings:
    """What every compare holds, whatever its command runs: methods, pairs, where, how many runs at once."""

    out: str = "runs/compare"  # directory: one run per method and pair, the table and the plots
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_METHODS))  # names; train: method:advantage too
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])  # one run per method and seed
    warm_starts: list[int] = field(default_factory=lambda: [0])  # tiny@W starts (sft seeds); a pair is (W, seed)
    workers: int = 1  # runs at once, each in its own process with cores // workers torch threads (at least 1)

    ROOT_CHOICE: ClassVar[str] = "command"  # the key that picks the class (`config._root_class`)
    COMMAND: ClassVar[str] = ""  # the command this class runs

    @classmethod
    def choose_class(cls, value: str | None) -> type:
        """The config class of compare over `value` (None: over train)."""
        classes = {"train": CompareConfig, "rollout": RolloutCompareConfig}
        if value is None:
            return CompareConfig
        if value not in classes:
            why = f" ({NOT_HERE[value]})" if value in NOT_HERE else ""
            raise ValueError(f"command: compare runs one of {', '.join(classes)}, got {value!r}{why}")
        return classes[value]

    @property
    def shared(self) -> TrainConfig | RolloutConfig:
        """The chosen command's settings, which every run shares (`train` or `rollout`)."""
        return getattr(self, self.command)

    def __post_init__(self):
        if self.command != self.COMMAND:  # only a hand-built config can get here: the loader picks the class by it
            raise ValueError(f"command: {type(self).__name__} runs {self.COMMAND}, got {self.command!r}")
        # each entry is a method and, after ':', an advantage: TRACE's one check of each (trace_config)
        check_methods(list(dict.fromkeys(parse_method(m)[0] for m in self.methods)), oracle=False)
        for spec in self.methods:
            advantage = parse_method(spec)[1]
            if advantage and self.COMMAND != "train":
                raise ValueError(f"methods: {spec!r} names an advantage; {self.COMMAND} has no update, give the name")
            check_advantage(advantage, key="methods (the advantage after ':')")
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"methods: {self.methods} lists a method twice")
        if not self.seeds:
            raise ValueError("seeds: give at least one seed")
        for seed in self.seeds:
            check_seed(seed, "seeds")
        if len(set(self.seeds)) < len(self.seeds):
            raise ValueError(f"seeds: each seed once, got {self.seeds}")
        if not self.out:
            raise ValueError("out must be a directory path, got an empty string")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1 (runs at once), got {self.workers}")
        if not self.warm_starts or len(set(self.warm_starts)) < len(self.warm_starts):
            raise ValueError(f"warm_starts: each warm start once, at least one, got {self.warm_starts}")
        for w in self.warm_starts:
            check_seed(w, "warm_starts")
        model = self.shared.policy.model
        if self.warm_starts != [0] and model not in ("tiny", "tiny@0"):
            raise ValueError(
                f"warm_starts: only the tiny policy has several warm starts (tiny@W); {self.COMMAND}.policy.model is "
                f"{model!r}"
            )


def _per_run(group: str, methods: str, **more: str) -> dict[str, str]:
    """The keys of `group` that compare sets for each run itself (`SET_PER_RUN`: refused, and left out of --help,
    not ignored): where it writes, its seed, its method (the key `methods`), and `more` (key -> why)."""
    return {
        f"{group}.out": "each run writes to out/<method>/seed<k>; set out",
        f"{group}.seed": "each run takes one of seeds; set seeds",
        f"{group}.{methods}": "each run takes one of methods; set methods",
        **{f"{group}.{key}": why for key, why in more.items()},
    }


# A command's group comes in its own base class, listed first, so that the group follows the common settings:
# `config._fields` lists a class's own settings before inherited ones, and these classes declare none.
@dataclass
class _TrainGroup:
    command: str = "train"  # what each run is: train or rollout (its settings are the group of that name)
    train: TrainConfig = field(default_factory=TrainConfig)  # the settings every run shares (see SET_PER_RUN)

    SET_PER_RUN: ClassVar[dict[str, str]] = _per_run(
        "train", "method", resume="compare always resumes unfinished runs and reads finished ones"
    )


@dataclass
class _RolloutGroup:
    command: str = "rollout"  # what each run is: train or rollout (its settings are the group of that name)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # the settings every run shares (see SET_PER_RUN)

    SET_PER_RUN: ClassVar[dict[str, str]] = _per_run("rollout", "methods")


@dataclass
class CompareConfig(_TrainGroup, CompareSettings):
    """`trace-rl compare`: methods trained from one start at equal rollout budget, paired over seeds (command=rollout:
    their trees from a frozen policy instead)."""

    COMMAND: ClassVar[str] = "train"


@dataclass
class RolloutCompareConfig(_RolloutGroup, CompareSettings):
    """`trace-rl compare command=rollout`: methods' trees from one frozen policy at equal budget, paired over seeds."""

    COMMAND: ClassVar[str] = "rollout"


# -- rollout's runs: a run directory per method and pair, its settings kept beside it ------------------------
ROLLOUT_NOT_SETTINGS = ("out", "progress", "save_trees")  # where it writes and how it reports, not what it computes


def _rollout_config(cfg: RolloutCompareConfig, spec: str, seed: int, warm: int = 0) -> RolloutConfig:
    run_cfg = copy.deepcopy(cfg.rollout)
    run_cfg.methods, run_cfg.seed = [spec], seed
    if warm:
        run_cfg.policy.model = f"tiny@{warm}"
    run_cfg.out = str(Path(cfg.out) / run_dir_name(spec) / pair_name(warm, seed))
    return run_cfg


def _rollout_settings(cfg: RolloutConfig) -> dict:
    d = dataclasses.asdict(cfg)
    return json.loads(json.dumps({k: v for k, v in d.items() if k not in ROLLOUT_NOT_SETTINGS}, default=str))


def _rollout_finished(run: Path, cfg: RolloutConfig) -> bool:
    """True if `run` holds a finished rollout run of `cfg`; raises if it holds a run of other settings."""
    from ..stack.env_config import upgrade_run_settings
    from ..train.checkpoint import setting_differences
    from ..train.run_settings import RUN_SETTINGS

    path = run / RUN_SETTINGS
    if not path.exists():
        return False
    diff = setting_differences(upgrade_run_settings(read_json(path, strict=False)), _rollout_settings(cfg))
    if diff:
        raise ConfigError(
            f"out: {run} holds a run with other settings (differs in {', '.join(diff)}); "
            "use another out, or the settings it was run with"
        )
    return (run / "rollout_summary.json").exists()


def _run_rollout(cfg: RolloutCompareConfig, spec: str, seed: int, warm: int, position: str = "") -> Path:
    """One method's rollout run on one pair through `rollout`'s runner, or the finished one read."""
    from omegaconf import OmegaConf

    run_cfg = _rollout_config(cfg, spec, seed, warm)
    run = Path(run_cfg.out)
    if not open_run(run, spec, seed, warm, _rollout_finished(run, run_cfg), _rollout_settings(run_cfg), position):
        return run
    from ..rollout.run_lock import run_lock

    with run_lock(run, "a run of trace-rl compare"):
        rollout_command.run(run_cfg, OmegaConf.to_yaml(OmegaConf.structured(run_cfg)))
    return run


def load_rollout_runs(cfg: RolloutCompareConfig) -> dict[str, list[dict]]:
    """Every finished rollout run of cfg.methods under cfg.out on cfg.warm_starts, in pair order: per method,
    {seed, warm, pair, records} (a run of other settings is refused)."""
    from ..rollout.records import read_metrics

    runs: dict[str, list[dict]] = {}
    for spec in cfg.methods:
        found = []
        for summary in (Path(cfg.out) / run_dir_name(spec)).glob("*seed*/rollout_summary.json"):
            pair = parse_pair(summary.parent.name)
            if pair is None or pair[0] not in cfg.warm_starts:
                continue
            if not _rollout_finished(summary.parent, _rollout_config(cfg, spec, pair[1], pair[0])):
                continue
            records = read_metrics(summary.parent / "metrics.jsonl").get(spec, [])
            found.append({"seed": pair[1], "warm": pair[0], "pair": pair_name(*pair), "records": records})
        if found:
            runs[spec] = sorted(found, key=lambda s: (s["warm"], s["seed"]))
    return runs


def rollout_report(cfg: RolloutCompareConfig) -> list[dict]:
    """The rollout study's table over every finished run under cfg.out, printed and written as
    compare_summary.json / .txt, with the effective-ratio plot (seed bands); returns the rows."""
    from ..plots import plot_metric, plots_available
    from ..rollout.report import format_over_seeds, summarize_over_seeds, write_summary

    out = Path(cfg.out)
    runs = load_rollout_runs(cfg)
    rows = summarize_over_seeds(runs)
    write_summary(out / "compare_summary", rows, format_over_seeds(rows))
    files = "compare_summary.json, compare_summary.txt"
    if plots_available():  # else one line says they were skipped
        per_seed = {m: [s["records"] for s in seeds] for m, seeds in runs.items()}
        title = "Effective ratio per step (mean and seed band)"
        plot_metric(per_seed, "rollout/effective_ratio", out / "effective_ratio.png", title, smooth=3)
        files += ", effective_ratio.png"
    print(f"\nwrote {out}/{files}; each run's folder holds its run.log")
    return rows


# -- the jobs ------------------------------------------------------------------------------------------------
Job = tuple[str, int, int]  # (method, seed, warm start)


def study_jobs(cfg: CompareSettings) -> list[Job]:
    """Every (method, seed, warm start) of the study, pair by pair, so a study stopped part-way holds complete
    pairs."""
    return [(spec, seed, warm) for warm in cfg.warm_starts for seed in cfg.seeds for spec in cfg.methods]


def run_folder(cfg: CompareSettings, spec: str, seed: int, warm: int) -> Path:
    return Path(cfg.out) / run_dir_name(spec) / pair_name(warm, seed)


def run_label(spec: str, seed: int, warm: int) -> str:
    """What a run's lines start with when runs print at once: its method and its pair, as its folder is named."""
    return f"{spec} {pair_name(warm, seed)}"


def is_finished(cfg: CompareSettings, spec: str, seed: int, warm: int) -> bool:
    """Whether the run is finished under these settings; ConfigError if its folder holds other settings'."""
    if cfg.command == "train":
        return train_study.is_finished(cfg, spec, seed, warm)
    return _rollout_finished(run_folder(cfg, spec, seed, warm), _rollout_config(cfg, spec, seed, warm))


def check_study(cfg: CompareSettings) -> list[Job]:
    """Every check that can refuse the study before its first run, made before anything is written under `out`
    (so a refused compare leaves nothing behind): the env builds (a missing corpus or sandbox), and no run folder
    holds a run of other settings. Returns the jobs still to run (the finished ones are read, not rerun)."""
    from ..stack.build import build_env

    build_env(cfg.shared.env)
    return [job for job in study_jobs(cfg) if not is_finished(cfg, *job)]


def run_one(cfg: CompareSettings, spec: str, seed: int, warm: int = 0, position: str = "") -> Path:
    """One method's run on one pair, through its command's runner (or read when finished); its directory."""
    if cfg.command == "train":
        return train_study.run_one(cfg, spec, seed, warm, train_command.run, position)
    return _run_rollout(cfg, spec, seed, warm, position)


def _run_logged(cfg: CompareSettings, job: Job, position: str, labelled: bool) -> Path:
    """`run_one` with its output also in the run's run.log, each line labelled with the run when `labelled`."""
    from .run_log import run_output

    with run_output(run_folder(cfg, *job), run_label(*job), labelled):
        return run_one(cfg, *job, position=position)


def _run_in_worker(cfg: CompareSettings, job: Job, position: str, threads: int) -> Path:
    import torch

    torch.set_num_threads(threads)
    return _run_logged(cfg, job, position, labelled=True)


def _naming_the_run(err: UserError, job: Job) -> UserError:
    """The same refusal with the run it came from in front (two runs at once: which one it was)."""
    try:
        return type(err)(f"{run_label(*job)}: {err}")
    except TypeError:  # an error type with another constructor: as it was
        return err


def _ensure_warm_starts(cfg: CompareSettings) -> None:
    from ..lm.warm_start import is_tiny

    if is_tiny(cfg.shared.policy.model):
        from ..train.trainer import ensure_policy

        for warm in cfg.warm_starts:
            start_cfg = copy.deepcopy(cfg.shared)
            start_cfg.policy.model = f"tiny@{warm}"
            ensure_policy(start_cfg)


def run_all(cfg: CompareSettings, todo: list[Job] | None = None) -> None:
    """The runs in `todo` (default: every unfinished one), pair by pair; with workers > 1, that many at once in
    spawned processes of cores // workers torch threads each, every line they print labelled with its run. Each
    run's output also goes to run.log in its folder. After each run, one line: runs done of the total and the
    time left at the pace so far. The warm starts are built first, here, once each (a build holds a lock too, so
    a second compare on the same cache waits for it rather than training it again)."""
    from ..rollout.run_loop import duration, time_left

    todo = [job for job in study_jobs(cfg) if not is_finished(cfg, *job)] if todo is None else todo
    _ensure_warm_starts(cfg)
    read = len(study_jobs(cfg)) - len(todo)
    print(
        f"compare: {len(todo)} runs to go"
        + (f" ({read} finished ones read, not rerun)" if read else "")
        + (f", {cfg.workers} at once, each line labelled [method pair]" if cfg.workers > 1 and len(todo) > 1 else "")
        + "; each run's output also goes to its folder's run.log",
        file=sys.stderr,
        flush=True,
    )
    start, n = time.monotonic(), len(todo)

    def done_line(k: int) -> None:
        elapsed = time.monotonic() - start
        # every run left already running beside others: their pace so far says nothing of when they end
        running = n - k if 1 < cfg.workers and 0 < n - k < cfg.workers else 0
        left = f"{running} still running" if running else time_left(elapsed, k, n)
        print(f"compare: {k} of {n} runs done in {duration(elapsed)}" + (f", {left}" if left else ""), file=sys.stderr)

    positions = [f"run {i} of {n}" for i in range(1, n + 1)]
    if cfg.workers == 1 or n <= 1:
        for k, (job, position) in enumerate(zip(todo, positions), 1):
            try:
                _run_logged(cfg, job, position, labelled=False)
            except UserError as err:
                raise _naming_the_run(err, job) from None
            done_line(k)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    threads = max(1, (os.cpu_count() or 1) // cfg.workers)
    context = multiprocessing.get_context("spawn")  # torch and fork do not mix
    with ProcessPoolExecutor(cfg.workers, mp_context=context) as pool:
        futures = {pool.submit(_run_in_worker, cfg, job, p, threads): job for job, p in zip(todo, positions)}
        for k, done in enumerate(as_completed(futures), 1):
            try:
                done.result()
            except BaseException as err:  # the first failure stops the command: the runs not begun never begin
                pool.shutdown(wait=True, cancel_futures=True)
                if isinstance(err, UserError):
                    raise _naming_the_run(err, futures[done]) from None
                raise
            done_line(k)


def run(cfg: CompareSettings, yaml_text: str = "") -> list[dict]:
    """Every run of the study (those finished are read), then its table and plots; returns the table's rows.
    Every check that can refuse the study comes before anything is written (`check_study`)."""
    todo = check_study(cfg)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    if yaml_text:
        (out / "config.yaml").write_text(yaml_text)
    run_all(cfg, todo)
    return train_study.report(cfg) if cfg.command == "train" else rollout_report(cfg)
