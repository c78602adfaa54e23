"""What the command line promises: every user error of every command is one line naming the setting, exit code
2, no traceback, before work; an internal error (a bug) keeps its traceback and exits 1."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from trace_rl import cli
from trace_rl.cli import main
from trace_rl.commands import propositions
from trace_rl.tree import RolloutTree, save_trees


@pytest.fixture
def files(tmp_path):
    corpus = tmp_path / "corpus.json"
    corpus.write_text(json.dumps([{"title": "A", "text": "alpha beta"}]))
    bad_corpus = tmp_path / "bad_corpus.json"
    bad_corpus.write_text("[1, 2, 3]")
    run = tmp_path / "run"
    run.mkdir()
    (run / "predictions.jsonl").write_text("{not json\n")
    yamls = {
        "bad_yaml": "steps: [1\nx: :\n",  # a syntax error
        "alias_yaml": "a: &a [*a]\n",  # a recursive alias
        "list_yaml": "- 1\n- 2\n",  # not a mapping
        "binary_yaml": b"\xff\xfe",
    }
    paths = {}
    for name, text in yamls.items():
        paths[name] = tmp_path / f"{name}.yaml"
        (paths[name].write_bytes if isinstance(text, bytes) else paths[name].write_text)(text)
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)  # deeper than json's recursive parser goes
    (tmp_path / "binary.dat").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "compare.yaml").write_text("train:\n  out: elsewhere\n")
    (tmp_path / "text.jsonl").write_text("hello\n")
    dict_corpus = tmp_path / "dict_corpus.json"
    dict_corpus.write_text(json.dumps([{"contents": 3}]))
    trees = tmp_path / "trees_x.jsonl"
    save_trees(trees, [RolloutTree(0, prompt="q")])
    (tmp_path / "env.yaml").write_text("env:\n  hint_noise: ${oc.env:TRACE_RL_TEST_SECRET,0.3}\n")
    return {
        "trees": trees,
        "corpus": corpus,
        "bad_corpus": bad_corpus,
        "dict_corpus": dict_corpus,
        "run": run,
        "tmp": tmp_path,
        **paths,
    }


CASES = [
    (["simulate", "out=/etc/passwd/x", "steps=1"], "out"),
    (["simulate", "out="], "out"),
    (["simulate", "methods="], "methods"),
    (["simulate", "steps=0"], "steps"),
    (["rollout", "steps=0"], "steps"),
    (["rollout", "methods="], "methods"),
    (["rollout", "policy.device=cuda"], "device"),
    (["eval", "limit=-1"], "limit"),
    (["eval", "k=0"], "k"),
    (["eval", "eval_samples=0"], "eval_samples"),
    (["eval", "samples=2"], "samples: renamed; set eval_samples"),
    (["eval", "policy.device=cuda:3"], "policy.device"),
    (["eval", "env=chess"], "env"),
    (["diagnose", "{run}", "max_depth=-1"], "max_depth"),
    (["diagnose", "{run}"], "run_dir"),
    (["diagnose", "{tmp}/nope"], "run_dir"),
    (["diagnose"], "run_dir"),
    (["view", "{tmp}/none.jsonl"], "trees"),
    (["serve-retriever", "corpus={bad_corpus}", "port=0"], "corpus"),
    (["serve-retriever", "corpus={corpus}", "port=70000"], "port"),
    (["serve-retriever", "corpus={corpus}", "host=no-such-host.invalid", "allow_remote=true", "port=0"], "host"),
    (["serve-retriever", "corpus={corpus}", "port=busy"], "port"),
    (["serve-retriever", "corpus={dict_corpus}", "port=0"], "corpus"),
    (["serve-retriever", "corpus={tmp}/none.json", "port=0"], "corpus"),
    (["serve-retriever", "corpus={corpus}", "dense=true", "encoder=/nonexistent", "port=0"], "encoder"),
    (["eval", "env=qa", "corpus={bad_corpus}"], "corpus"),
    (["train", "--config", "{bad_yaml}"], "--config"),
    (["compare", "--config", "{bad_yaml}"], "--config"),
    (["train", "--config", "{alias_yaml}"], "--config"),
    (["simulate", "--config", "{list_yaml}"], "--config"),
    (["simulate", "--config", "{binary_yaml}"], "--config"),
    (["simulate", "--config", "{tmp}/none.yaml"], "--config"),
    (["simulate", "methods=grpo,grpo", "out={tmp}/sim"], "methods"),
    (["view", "{tmp}/empty.jsonl"], "trees"),
    (["view", "{tmp}/text.jsonl"], "trees"),
    (["rollout", "policy.model=./no/such/model", "out={tmp}/r"], "policy.model"),
    (["propositions", "tasks=0"], "tasks"),
    (["sft", "steps=0"], "steps"),
    (["nonsense"], "nonsense"),
    # each of these once ended in a traceback, ran for ever, or named no setting or the wrong one
    (["propositions", "seed=-1"], "seed"),
    (["simulate", "seeds=1,-2"], "seeds"),
    (["simulate", "env.seed=-1"], "env.seed"),
    (["train", "seed=99999999999999999999999"], "seed"),
    (["propositions", "episodes=1000000000000"], "episodes"),  # once: allocate 7.28 TiB
    (["propositions", "tasks=1000000000"], "tasks"),  # once: ran for ever
    (["view", "trees={tmp}/deep.json"], "trees"),
    (["serve-retriever", "corpus={corpus}", "host=8.8.8.8"], "host"),
    (["serve-retriever", "corpus={corpus}", "host=nonexistent.invalid"], "host"),
    (["serve-retriever", "corpus={corpus}", "dense=true", "encoder=nosuchorg/nosuchencoder"], "encoder"),
    (["eval", "data={tmp}/binary.dat"], "data"),
    (["simulate", "env.hint_noise=-1"], "env.hint_noise"),
    (["simulate", "env.difficulty_mix=1,2"], "env.difficulty_mix"),
    (["sft", "sft.max_minutes=-1"], "sft.max_minutes"),
    (["propositions", "seed=\udcff"], "seed"),  # the byte 0xff as Python hands it over (PEP 383)
    (["propositions", "se\udcffed=1"], "se\\xffed"),
    (["compare", "train.out={tmp}/x"], "train.out"),
    (["compare", "train.seed=4"], "train.seed"),
    (["compare", "--config", "{tmp}/compare.yaml"], "train.out"),
    (["compare", "command=simulate"], "command"),
    (["compare", "--command", "eval"], "command"),
    (["compare", "command=rollout", "rollout.seed=4"], "rollout.seed"),
    (["compare", "command=rollout", "methods=trace:grpo"], "methods"),
    (["fetch-data", "out={tmp}/data", "sets=chess"], "sets"),
    (["fetch-data", "out={tmp}/data", "mirror=ftp://example.org"], "mirror"),
    (["fetch-data", "out={tmp}/data", "mirror=file://{tmp}/no-mirror"], "mirror"),
    # issue 50, item 6: each once a traceback, a run that could not end, or a secret copied into config.yaml
    (["view", "{trees}", "out=/etc/passwd/x.html"], "out"),
    (["train", "logger=" + ",".join(["none"] * 20_000)], "logger"),
    (["simulate", "seeds=" + ",".join(map(str, range(100_000)))], "seeds"),
    (["simulate", "seeds=" + ",".join(map(str, range(2_000)))], "seeds"),
    (["simulate", "steps=[" + ",".join(["1"] * 20_000) + "]"], "steps"),
    (["eval", "data=" + "a" * 100_000], "data"),
    (["eval", "data={tmp}/" + "a" * 300], "data"),
    (["view", "{tmp}/" + "a" * 300], "trees"),
    (["simulate", "out={tmp}/" + "a" * 300], "out"),
    (["train", "steps=99999999999999999999"], "steps"),
    (["simulate", "steps=1000001"], "steps"),
    (["simulate", "budget.prompts=1000000000"], "budget.prompts"),
    (["compare", "command=rollout", "rollout.budget.rollouts_per_prompt=1000000000"], "rollouts_per_prompt"),
    (["diagnose", "{run}", "max_depth=1000000"], "max_depth"),
    (["simulate", "out=${{oc.env:HOME}}/x"], "out"),
    (["simulate", "--config", "{tmp}/env.yaml", "out={tmp}/sim"], "env.hint_noise"),
    (["simulate", "env.hint_noise=nan"], "env.hint_noise"),
    (["train", "env=bfcl", "env.bfcl.call_timeout_s=inf"], "env.bfcl.call_timeout_s"),
]


@pytest.mark.parametrize(
    "argv, key", CASES, ids=[" ".join(c[0]).encode("utf-8", "backslashreplace").decode()[:60] for c in CASES]
)
def test_bad_input_is_one_line_naming_the_setting(files, capsys, monkeypatch, argv, key):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # an uncached hub id is refused at once, whatever the network
    if argv[0] == "serve-retriever" and any(a.startswith(("host=", "port=busy")) for a in argv):
        pytest.importorskip("bm25s")  # the address is checked after the index is built (the envs extra)
    if argv[0] in ("train", "compare"):
        pytest.importorskip("torch")  # their settings load the trainer (the lm extra)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        args = [a.format(**files).replace("port=busy", f"port={busy.getsockname()[1]}") for a in argv]
        assert main(args) == 2
    finally:
        busy.close()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and key in err and "Traceback" not in err, err[:2000]
    assert len(err) < 1000  # the message names the setting; it does not echo a 100,000-character value


def test_interpolation_never_reaches_a_runs_config(files, monkeypatch, capsys):
    from trace_rl.config import load_config
    from trace_rl.errors import ConfigError
    from trace_rl.testbed.simulate import SimulateConfig

    monkeypatch.setenv("TRACE_RL_TEST_SECRET", "0.123456")  # what OmegaConf would resolve and write back
    for argv in (["--config", str(files["tmp"] / "env.yaml")], ["env.hint_noise=${oc.env:TRACE_RL_TEST_SECRET}"]):
        with pytest.raises(ConfigError, match="interpolation is not read"):
            load_config(SimulateConfig, argv)
    out = files["tmp"] / "sim"
    assert main(["simulate", "--config", str(files["tmp"] / "env.yaml"), f"out={out}", "steps=1"]) == 2
    assert not out.exists() and "0.123456" not in capsys.readouterr().err


def boom(exc: BaseException):
    def run(cfg, yaml_text):
        raise exc

    return run


def test_an_internal_error_keeps_its_traceback(files, monkeypatch):
    # a ValueError or FileNotFoundError from inside a command is a bug, not a bad setting: it is not hidden
    for exc in (ValueError("a bug"), FileNotFoundError("a bug"), KeyError("a bug")):
        monkeypatch.setattr(propositions, "run", boom(exc))
        with pytest.raises(type(exc)):
            main(["propositions"])
    script = (
        "import sys, trace_rl.cli as c, trace_rl.commands.propositions as p\n"
        "def run(cfg, y): raise ValueError('an internal error')\n"
        "p.run = run\n"
        "sys.exit(c.main(['propositions']))\n"
    )
    src = Path(cli.__file__).parents[1]
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(src)},
    )
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "ValueError: an internal error" in proc.stderr


def test_a_missing_optional_package_is_one_line_but_a_missing_module_of_trace_rl_is_a_bug(monkeypatch, capsys):
    monkeypatch.setattr(propositions, "run", boom(ModuleNotFoundError("No module named 'bm25s'", name="bm25s")))
    assert main(["propositions"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'bm25s'" in err and "not installed" in err
    monkeypatch.setattr(propositions, "run", boom(ModuleNotFoundError("gone", name="trace_rl.gone")))
    with pytest.raises(ModuleNotFoundError):
        main(["propositions"])


def test_compare_help_lists_no_key_it_sets_per_run(capsys):
    pytest.importorskip("torch")
    assert main(["compare", "--help"]) == 0
    out = capsys.readouterr().out
    assert "train.steps=" in out and "train.advantage=" in out
    for key in ("train.out=", "train.seed=", "train.method=", "train.resume="):
        assert key not in out, key
