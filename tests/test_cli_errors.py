"""Every user error of every command: one line naming the setting, exit code 2, no traceback, before work."""

import json
import socket

import pytest

from trace_rl.cli import main


@pytest.fixture
def files(tmp_path):
    corpus = tmp_path / "corpus.json"
    corpus.write_text(json.dumps([{"title": "A", "text": "alpha beta"}]))
    bad_corpus = tmp_path / "bad_corpus.json"
    bad_corpus.write_text("[1, 2, 3]")
    run = tmp_path / "run"
    run.mkdir()
    (run / "predictions.jsonl").write_text("{not json\n")
    return {"corpus": corpus, "bad_corpus": bad_corpus, "run": run, "tmp": tmp_path}


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
    (["eval", "samples=0"], "samples"),
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
    (["propositions", "tasks=0"], "tasks"),
    (["sft", "steps=0"], "steps"),
    (["nonsense"], "nonsense"),
]


@pytest.mark.parametrize("argv, key", CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_bad_input_is_one_line_naming_the_setting(files, capsys, argv, key):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        args = [a.format(**files).replace("port=busy", f"port={busy.getsockname()[1]}") for a in argv]
        assert main(args) == 2
    finally:
        busy.close()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and key in err and "Traceback" not in err, err
