"""The `trace-rl` command line: `trace-rl CMD [--config FILE.yaml] [key=value ...]`, one typed config per command
(`config.py`). Every user error (`errors.UserError`) is one line naming the setting, exit code 2, before any work
starts where it can be known then; any other exception is a bug and keeps its traceback (exit code 1)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .config import check_count, help_text, load_config, write_config
from .errors import ConfigError, UserError
from .stack.config import EngineConfig, LMEnvConfig, LMPolicyConfig, check_seed, env_config


# -- small commands' settings (the big ones live beside their code) ------------------------------------------
@dataclass
class DiagnoseConfig:
    """`trace-rl diagnose RUN_DIR`: predictor quality by depth (Spearman, calibration, Brier) for a run."""

    run_dir: str = ""  # the run directory to read (predictions.jsonl, metrics.jsonl)
    max_depth: int = 4  # depths beyond this are pooled
    out: str = ""  # where the plots go (default: the run directory)

    def __post_init__(self):
        if not self.run_dir:
            raise ValueError("run_dir: give the run directory, e.g. trace-rl diagnose runs/simulate")
        if self.max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {self.max_depth}")


@dataclass
class ViewConfig:
    """`trace-rl view TREES.jsonl ...`: one self-contained HTML page that shows each prompt's tree."""

    trees: list[str] = field(default_factory=list)  # trees files (trees_<method>.jsonl, sft_eval_trees.jsonl)
    out: str = "tree.html"  # the HTML file to write
    title: str = "TRACE rollout trees"  # the page's title

    def __post_init__(self):
        if not self.trees:
            raise ValueError("trees: give one or more trees files, e.g. trace-rl view runs/simulate/trees_trace.jsonl")
        missing = [t for t in self.trees if not Path(t).is_file()]
        if missing:
            raise ValueError(f"trees: no file {missing[0]}")
        if not self.out:
            raise ValueError("out: give the HTML file to write")


@dataclass
class EvalConfig:
    """`trace-rl eval`: accuracy of a model on an environment's benchmarks (pass@1, pass@k)."""

    bench: list[str] = field(default_factory=list)  # benchmarks to run (default: all of the env's)
    data: str = ""  # a task file instead (verl / Search-R1 / SkyRL parquet or JSON-lines rows; its system kept)
    limit: int = 0  # first N tasks of each benchmark (0: all)
    k: list[int] = field(default_factory=lambda: [1])  # k of pass@k
    samples: int = 1  # samples per task (at least the largest k)
    seed: int = 0  # one seed reproduces the samples
    out: str = ""  # a directory for per-sample results (samples.jsonl) and the resolved config (default: none)
    policy: LMPolicyConfig = field(default_factory=LMPolicyConfig)
    env: LMEnvConfig = field(default_factory=env_config)

    def __post_init__(self):
        if self.limit < 0:
            raise ValueError(f"limit must be >= 0 (0: every task), got {self.limit}")
        if self.samples < 1:
            raise ValueError(f"samples must be >= 1, got {self.samples}")
        if not self.k or min(self.k) < 1:
            raise ValueError(f"k must be one or more integers >= 1, got {self.k}")
        check_seed(self.seed)
        if self.data and not Path(self.data).is_file():
            raise ValueError(f"data: no file {self.data}")
        if self.data and self.bench:
            raise ValueError("bench: give either data=FILE or bench names, not both")


@dataclass
class ServeRetrieverConfig:
    """`trace-rl serve-retriever`: a Search-R1-compatible /retrieve server over a passage corpus."""

    corpus: str = ""  # HotpotQA {title: sentences} or a list of {title, text}
    host: str = "127.0.0.1"  # listen address (loopback unless you ask otherwise)
    allow_remote: bool = False  # allow a non-loopback host (the server has no authentication)
    port: int = 8000  # listen port (0: any free port)
    dense: bool = False  # faiss + encoder instead of BM25
    encoder: str = "all-minilm-l6-v2"  # the dense retriever's sentence encoder

    def __post_init__(self):
        if not self.corpus:
            raise ValueError("corpus: give a passage corpus file")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.dense and self.encoder.startswith((".", "/", "~")) and not Path(self.encoder).expanduser().is_dir():
            raise ValueError(f"encoder: no directory {self.encoder} (give a local encoder or 'all-minilm-l6-v2')")
        if not self.allow_remote and not _loopback(self.host):  # serve() checks it again; here before any work
            raise ValueError(
                f"host: {self.host!r} is not a loopback address; the server has no authentication, so serving "
                "beyond this machine needs allow_remote=true"
            )


def _loopback(host: str) -> bool:
    """The rule of `retrieval_server.serve` (localhost or a loopback IP), applied before the index is built."""
    import ipaddress

    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class PropositionsConfig:
    """`trace-rl propositions`: check the paper's Propositions 1 and 2 on the testbed."""

    tasks: int = 64  # testbed tasks to check exactly
    episodes: int = 4000  # Monte Carlo episodes
    seed: int = 0  # one seed reproduces the Monte Carlo figures

    def __post_init__(self):
        # about 2 ms a task and 0.2 ms an episode on one core: the bounds are minutes, not days
        check_count("tasks", self.tasks, 100_000, why="about 3 minutes")
        check_count("episodes", self.episodes, 1_000_000, why="about 4 minutes")


# -- commands -----------------------------------------------------------------------------------------------
def _simulate(cfg, yaml_text: str) -> None:
    from .plots import per_seed, plot_metric
    from .rollout.records import average_runs, format_table, summarize
    from .testbed.report import format_seed_table, plot_accuracy_vs_cost, seed_statistics
    from .testbed.simulate import run_seeds

    out = Path(cfg.out)
    write_config(yaml_text, out)
    seeds = list(cfg.seeds) or [cfg.seed]
    runs = run_seeds(cfg, out)
    results = average_runs(runs)
    baseline = "grpo" if "grpo" in results else ("trace_uniform" if "trace_uniform" in results else cfg.methods[0])
    rows = summarize(results, baseline=baseline)
    accuracy = ""
    if len(seeds) > 1:
        stats = seed_statistics(runs, baseline=baseline)
        for row, stat in zip(rows, stats):
            row["er_per_seed"] = " ".join(
                f"{np.mean([r['rollout/effective_ratio'] for r in run[row['method']]]):.3f}" for run in runs
            )
            row["accuracy_over_seeds"] = stat
        accuracy = (
            f"exact held-out accuracy over seeds {seeds}: mean [95% interval]; differences paired by seed at "
            f"equal rollouts\n{format_seed_table(stats, baseline=baseline)}\n\n"
        )
    table = format_table([{k: v for k, v in r.items() if k != "accuracy_over_seeds"} for r in rows])
    if len(seeds) > 1:
        table = accuracy + f"mean over seeds {seeds}\n" + table
    print(table)
    (out / "summary.json").write_text(json.dumps(rows, indent=2))
    (out / "summary.txt").write_text(table + "\n")
    per = per_seed(runs) if len(seeds) > 1 else results
    plot_metric(
        per, "rollout/effective_ratio", out / "effective_ratio.png", "Effective ratio (share of mixed trees)", smooth=5
    )
    plot_metric(per, "eval/accuracy", out / "accuracy.png", "Exact held-out accuracy")
    plot_accuracy_vs_cost(runs, out / "accuracy_vs_rollouts.png")
    plot_accuracy_vs_cost(runs, out / "accuracy_vs_turns.png", cost="turns")
    where = ", ".join(f"{out}/seed{s}/metrics.jsonl" for s in seeds) if len(seeds) > 1 else f"{out}/metrics.jsonl"
    print(
        f"\nwrote {out}/config.yaml, {where}, {out}/summary.json, effective_ratio.png, accuracy.png, "
        "accuracy_vs_rollouts.png, accuracy_vs_turns.png"
    )


def _rollout(cfg, yaml_text: str) -> None:
    from .plots import plot_metric
    from .rollout.records import format_table, summarize
    from .train.rollout_compare import run_rollout

    out = Path(cfg.out)
    write_config(yaml_text, out)
    results = run_rollout(cfg)
    rows = summarize(results)
    table = format_table(rows)
    print(table)
    (out / "rollout_summary.json").write_text(json.dumps(rows, indent=2))
    (out / "rollout_summary.txt").write_text(table + "\n")
    plot_metric(
        results, "rollout/effective_ratio", out / "effective_ratio.png", "Effective ratio (share of mixed trees)"
    )
    print(f"\nwrote {out}/config.yaml, rollout_summary.json, metrics.jsonl, predictions.jsonl, effective_ratio.png")


def _sft(cfg, yaml_text: str) -> None:
    from .train.sft import run_sft

    run_sft(cfg, yaml_text)


def _train(cfg, yaml_text: str) -> None:
    from .train.trainer import train

    s = train(cfg, yaml_text)
    before, after = ("-" if s[k] is None else f"{s[k]:.3f}" for k in ("accuracy_before", "accuracy_after"))
    print(
        f"held-out accuracy: {before} before, {after} after {s['steps']} steps "
        f"({s['rollouts']:,} rollouts); peak resident memory {s['peak_rss_gib']:.2f} GiB"
    )
    from .rollout.records import read_metrics

    records = next(iter(read_metrics(Path(cfg.out) / "metrics.jsonl").values()), [])
    er = np.mean([r["rollout/effective_ratio"] for r in records]) if records else float("nan")
    print(f"effective ratio (mean over steps): {er:.3f}")
    try:
        from .plots import plot_chain, plot_metric, with_start

        by = {cfg.method: records}
        plot_metric(by, "rollout/effective_ratio", Path(cfg.out) / "effective_ratio.png", "Effective ratio per step")
        acc = {cfg.method: with_start(records)}  # from the accuracy before training, at step 0
        plot_metric(acc, "eval/accuracy", Path(cfg.out) / "accuracy.png", "Held-out accuracy")
        plot_metric(by, "train/loss", Path(cfg.out) / "loss.png", "Policy loss")
        plot_chain(by, Path(cfg.out) / "chain.png", "Effective ratio -> signal -> update size -> accuracy")
        print(
            f"plots: {cfg.out}/effective_ratio.png, accuracy.png, loss.png, chain.png; metrics: {cfg.out}/metrics.jsonl"
        )
    except ImportError:
        print("plots skipped: matplotlib is not installed (pip install 'trace-rl[plots]')", file=sys.stderr)


def _compare(cfg, yaml_text: str) -> None:
    from .train.compare import run_compare

    run_compare(cfg, yaml_text)


def _diagnose(cfg, yaml_text: str) -> None:
    from .diagnose import diagnose, format_calibration, format_diagnosis

    out = cfg.out or cfg.run_dir
    try:
        found = diagnose(cfg.run_dir, max_depth=cfg.max_depth, out_dir=out)
    except FileNotFoundError as err:
        raise ConfigError(f"run_dir: {err}") from None
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"run_dir: {cfg.run_dir} does not hold a readable run ({err})") from None
    print(format_diagnosis(found.tables))
    print()
    print(format_calibration(found))
    if found.plots:
        print(f"\nwrote {', '.join(str(p) for p in found.plots)}")
    else:
        print(f"\n{found.note}", file=sys.stderr)


def _view(cfg, yaml_text: str) -> None:
    from .viewer import load_entries, write_tree_html

    try:
        entries = load_entries(list(cfg.trees))
    except (ValueError, FileNotFoundError) as err:  # load_entries' own messages name the file and line
        raise ConfigError(f"trees: {err}") from None
    if not entries:
        raise ConfigError(f"trees: {', '.join(cfg.trees)} hold no trees (written by simulate, rollout, train or sft)")
    path = write_tree_html(entries, cfg.out, title=cfg.title)
    print(f"wrote {path} (one self-contained file: open it in a browser)")


def _eval(cfg, yaml_text: str) -> None:
    from .rollout.evaluate import check_context, evaluate
    from .rollout.records import format_table
    from .stack.build import build_actor, build_env, build_policy

    spec = build_env(cfg.env)
    if cfg.data:
        from .envs.data import load_tasks

        try:  # read before the model loads: a file that holds no rows stops the command before any work
            rows = load_tasks(cfg.data, cfg.limit or None)
        except UserError as err:
            raise ConfigError(f"data: {err}") from None
        spec.benchmarks = {Path(cfg.data).stem: lambda n: rows}
    benches = list(cfg.bench) or list(spec.benchmarks)
    unknown = [b for b in benches if b not in spec.benchmarks]
    if unknown:
        raise ConfigError(f"bench: unknown {unknown} for env {cfg.env.name}; choose from {', '.join(spec.benchmarks)}")
    samples = max(max(cfg.k), cfg.samples)
    policy = build_policy(cfg.policy, seed=cfg.seed)
    actor = build_actor(policy, spec, cfg.policy.sampling(spec.max_new_tokens), EngineConfig())
    rows = []
    out = Path(cfg.out) if cfg.out else None
    if out:
        write_config(yaml_text, out)
        (out / "samples.jsonl").write_text("")
    try:
        for bench in benches:
            tasks = spec.benchmarks[bench](cfg.limit or None)
            try:  # the model against the tasks, before any generation
                check_context(actor, tasks, bench)
            except ValueError as err:
                raise ConfigError(f"policy.model: {err}") from None
            results: list = []
            res = evaluate(actor, tasks, samples=samples, ks=tuple(cfg.k), seed=cfg.seed, label=bench, results=results)
            rows.append({"benchmark": bench, **res})
            if out:
                with open(out / "samples.jsonl", "a", encoding="utf-8") as fh:
                    for r in results:
                        fh.write(json.dumps({"benchmark": bench, **r}) + "\n")
    finally:
        policy.close()
    print(format_table(rows))
    if out:
        print(f"\nwrote {out}/samples.jsonl (one line per sample) and {out}/config.yaml")


def _serve_retriever(cfg, yaml_text: str) -> None:
    import socket
    import time

    from .envs.retrieval import BM25Retriever, DenseRetriever, load_corpus
    from .envs.retrieval_server import serve

    passages = load_corpus(cfg.corpus)  # a corpus it cannot read is a ConfigError naming `corpus`
    if cfg.dense:
        try:
            retriever = DenseRetriever(passages, cfg.encoder)
        except OSError as err:  # transformers: no such directory, no config.json, or not on the hub (offline)
            raise ConfigError(f"encoder: cannot load {cfg.encoder!r} ({str(err).strip().splitlines()[0]})") from None
    else:
        retriever = BM25Retriever(passages)
    try:
        server = serve(retriever, cfg.host, cfg.port, allow_remote=cfg.allow_remote)
    except socket.gaierror:
        raise ConfigError(f"host: cannot resolve {cfg.host!r}") from None
    except OSError as err:
        raise ConfigError(f"port: cannot listen on {cfg.host}:{cfg.port} ({err.strerror or err})") from None
    print(f"serving {len(passages)} passages on http://{cfg.host}:{server.server_address[1]}/retrieve (Ctrl-C stops)")
    try:
        while True:
            time.sleep(3600)
    finally:
        server.shutdown()


def _fetch_data(cfg, yaml_text: str) -> None:
    from .envs.data_fetch import run_fetch

    run_fetch(cfg)


def _verl_data(cfg, yaml_text: str) -> None:
    from .integrations.verl.data import run_verl_data

    run_verl_data(cfg)


def _propositions(cfg, yaml_text: str) -> None:
    from .testbed.propositions import check_propositions, report_lines, verdicts

    r = check_propositions(tasks=cfg.tasks, episodes=cfg.episodes, seed=cfg.seed)
    print("\n".join(report_lines(r)))
    if not all(v.passed for v in verdicts(r)):
        raise SystemExit(1)  # a failed check is a failed command (CI and `make evidence` must see it)


def _config_classes() -> dict[str, tuple[str, object, str | None, str]]:
    """command -> (config class as 'module:Class', runner, positional key, one-line help); imported on use."""
    return {
        "train": (
            "trace_rl.train.trainer:TrainConfig",
            _train,
            None,
            "train an LM agent with TRACE (the main job; tiny CPU policy by default)",
        ),
        "compare": (
            "trace_rl.train.compare:CompareConfig",
            _compare,
            None,
            "train with several methods and seeds at equal budget; table and plots",
        ),
        "simulate": (
            "trace_rl.testbed.simulate:SimulateConfig",
            _simulate,
            None,
            "compare methods on the synthetic testbed at equal budget",
        ),
        "sft": (
            "trace_rl.train.sft:SFTConfig",
            _sft,
            None,
            "warm-start a policy on the built-in task's demonstrations and cache it",
        ),
        "rollout": (
            "trace_rl.train.rollout_compare:RolloutConfig",
            _rollout,
            None,
            "grow trees from a frozen policy with several methods",
        ),
        "eval": ("trace_rl.cli:EvalConfig", _eval, None, "accuracy of a model on an environment's benchmarks"),
        "view": ("trace_rl.cli:ViewConfig", _view, "trees", "write an HTML page that shows each prompt's tree"),
        "diagnose": ("trace_rl.cli:DiagnoseConfig", _diagnose, "run_dir", "predictor quality by depth for a run"),
        "serve-retriever": (
            "trace_rl.cli:ServeRetrieverConfig",
            _serve_retriever,
            None,
            "a Search-R1-compatible /retrieve server",
        ),
        "fetch-data": (
            "trace_rl.envs.data_fetch:FetchDataConfig",
            _fetch_data,
            None,
            "download the math and QA data sets (pinned, SHA-256 checked)",
        ),
        "verl-data": ("trace_rl.integrations.verl.data:VerlDataConfig", _verl_data, None, "verl's parquet rows"),
        "propositions": (
            "trace_rl.cli:PropositionsConfig",
            _propositions,
            None,
            "check the paper's Propositions 1 and 2",
        ),
    }


def _load_class(spec: str) -> type:
    import importlib

    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def _check_out(cfg) -> None:
    """The run directory can be created (before any work, so a bad `out` never costs a run)."""
    out = getattr(cfg, "out", "")
    if not out or out.endswith(".html"):
        return
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"out: cannot create the directory {out!r} ({err.strerror or err})") from None


def _probe(cfg) -> None:
    """A command's probes (an LM command's server and model: `stack.build.probe_policy`; serve-retriever's dense
    encoder), once, before any work. The configs are plain data, so building them (--help, compare's per-run
    configs) never probes."""
    if isinstance(cfg, ServeRetrieverConfig) and cfg.dense and cfg.encoder != "all-minilm-l6-v2":
        from .lm.models import check_model

        try:  # in seconds, before the corpus is read: an unknown hub id offline is not left to the hub's retries
            check_model(cfg.encoder)
        except ValueError as err:
            raise ConfigError(f"encoder: {str(err).removeprefix('model: ')}") from None
    policy = getattr(cfg, "policy", None)
    if policy is None:  # compare: the policy every run shares
        policy = getattr(getattr(cfg, "train", None), "policy", None)
    if isinstance(policy, LMPolicyConfig):
        from .stack.build import probe_policy

        probe_policy(policy)


def _usage(commands: dict) -> str:
    lines = ["usage: trace-rl COMMAND [--config FILE.yaml] [key=value ...]   (trace-rl COMMAND --help lists keys)", ""]
    lines += [f"  {name:<16} {spec[3]}" for name, spec in commands.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = _config_classes()
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage(commands))
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in commands:
        print(f"trace-rl: error: unknown command {command!r}; choose from {', '.join(commands)}", file=sys.stderr)
        return 2
    cls_spec, run, positional, _ = commands[command]
    try:
        cls = _load_class(cls_spec)
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
        _check_out(cfg)
        _probe(cfg)
        run(cfg, yaml_text)
    except UserError as err:  # anything else is a bug in trace-rl: it keeps its traceback (exit code 1)
        print(f"trace-rl {command}: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:
        if not err.name or err.name.split(".")[0] == "trace_rl":
            raise
        print(f"trace-rl {command}: error: needs the package {err.name!r}, which is not installed", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        said = "stopped" if command == "serve-retriever" else "interrupted; what was written so far is kept"
        print(f"trace-rl {command}: {said}", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
