"""Every reader of a file the user names stops one line past its bound with one line naming the file, the line and
the bound (issue 50, item 3). The bounds are lowered here (monkeypatch), so no test writes a big file."""

import json
import os
from dataclasses import replace

import pytest

from trace_rl.cli import main
from trace_rl.errors import UserError
from trace_rl.safe_read import BOUNDS, BadFile, NotRegularFile, TooLarge, read_lines
from trace_rl.tree import RolloutTree, load_trees, save_trees


def lower(monkeypatch, kind: str, line: int, file: int | None = None, document: int = 1 << 30) -> None:
    monkeypatch.setitem(BOUNDS, kind, replace(BOUNDS[kind], line=line, file=file, document=document))


def test_a_line_at_the_bound_reads_and_one_byte_more_is_refused_naming_file_line_and_bound(tmp_path, monkeypatch):
    lower(monkeypatch, "records", line=8)
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"12345678\n\n123456789\nnever read\n")
    lines = read_lines(path, "records")
    assert next(lines) == (1, "12345678") and next(lines) == (2, "")
    with pytest.raises(TooLarge) as err:
        next(lines)
    assert str(err.value) == f"{path}:3: a line over 8 bytes, the bound on a record"
    assert isinstance(err.value, UserError) and isinstance(err.value, ValueError)
    path.write_bytes(b"12345678")  # no final newline: the same bound
    assert list(read_lines(path, "records")) == [(1, "12345678")]
    path.write_bytes(b"123456789")
    with pytest.raises(TooLarge, match=":1: a line over"):
        list(read_lines(path, "records"))


def test_the_file_bound_and_text_that_is_not_utf8(tmp_path, monkeypatch):
    lower(monkeypatch, "records", line=100, file=10)
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"1234\n5678\n90\n")
    with pytest.raises(TooLarge, match=r"13 bytes, over the 10 bytes bound"):
        list(read_lines(path, "records"))
    path.write_bytes(b"ok\n\xff\xfe\n")
    with pytest.raises(BadFile, match=r"r\.jsonl:2: not UTF-8"):
        list(read_lines(path, "records"))


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFile, match="a FIFO"):
        list(read_lines(fifo, "trees"))


def test_the_bounds_fit_what_real_files_hold():
    # a tree line of a 64-leaf tree with 32k-token contexts is ~50 MB; a corpus of millions of passages has no bound
    assert BOUNDS["trees"].line >= 128 << 20 and BOUNDS["corpus"].file is None
    assert all(b.line >= 16 << 20 for b in BOUNDS.values())


def _tree_file(tmp_path):
    tree = RolloutTree(0, prompt="q")
    tree.add_turn(tree.root_id, thought="t", action="a", observation="o", terminal=True, reward=1.0)
    path = tmp_path / "trees_trace.jsonl"
    save_trees(path, [tree, tree])
    return path, len(path.read_bytes().splitlines()[0])


def test_trees_readers_refuse_a_tree_past_the_bound(tmp_path, monkeypatch, capsys):
    from trace_rl.viewer import load_entries

    path, width = _tree_file(tmp_path)
    lower(monkeypatch, "trees", line=width)
    assert len(load_trees(path)) == 2 and len(load_entries([path])) == 2
    lower(monkeypatch, "trees", line=width - 1)
    for read in (load_trees, lambda p: load_entries([p])):
        with pytest.raises(
            TooLarge, match=rf"trees_trace\.jsonl:1: a line over {width - 1:,} bytes, the bound on a tree"
        ):
            read(path)
    assert main(["view", str(path), f"out={tmp_path / 'v.html'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "trees:" in err and "the bound on a tree" in err
    assert not (tmp_path / "v.html").exists()


def test_a_runs_records_past_the_bound_metrics_diagnose_compare_and_store(tmp_path, monkeypatch, capsys):
    from trace_rl.results.store import compact_testbed_seed
    from trace_rl.rollout.records import read_metrics

    seed = tmp_path / "seed0"
    seed.mkdir()
    record = json.dumps({"method": "trace", "step": 0, "reward/mean": 0.5})
    (seed / "metrics.jsonl").write_text(record + "\n")
    (seed / "predictions.jsonl").write_text(json.dumps({"step": 0, "depth": 1, "predicted": 0.5}) + "\n")
    assert read_metrics(seed / "metrics.jsonl")["trace"][0]["step"] == 0
    assert compact_testbed_seed(seed)[0]["method"] == "trace"
    lower(monkeypatch, "records", line=len(record) - 1)
    with pytest.raises(TooLarge, match=r"metrics\.jsonl:1: a line over"):
        read_metrics(seed / "metrics.jsonl")
    with pytest.raises(TooLarge, match=r"metrics\.jsonl:1: a line over"):
        compact_testbed_seed(seed)
    lower(monkeypatch, "records", line=10)
    assert main(["diagnose", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run_dir:" in err and "predictions.jsonl:1: a line over 10 bytes" in err


def test_task_rows_past_the_bound_jsonl_and_json(tmp_path, monkeypatch, capsys):
    from trace_rl.envs.data import read_rows

    row = json.dumps({"question": "1+1?", "answer": "2"})
    lines = tmp_path / "tasks.jsonl"
    lines.write_text(f"{row}\n{row}\n")
    doc = tmp_path / "tasks.json"
    doc.write_text(f"[{row}, {row}]")
    assert len(read_rows(lines)) == 2 and len(read_rows(doc)) == 2
    lower(monkeypatch, "tasks", line=len(row) - 1, document=len(row))
    with pytest.raises(TooLarge, match=r"tasks\.jsonl:1: a line over .* the bound on a task row"):
        read_rows(lines)
    with pytest.raises(TooLarge, match=r"tasks\.json:1: a line over"):  # past the document bound: read as lines
        read_rows(doc)
    assert main(["eval", f"data={lines}", f"out={tmp_path / 'e'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "data" in err and "the bound on a task row" in err


def test_a_corpus_past_the_bound(tmp_path, monkeypatch, capsys):
    from trace_rl.envs.retrieval import load_corpus

    row = json.dumps({"title": "A", "text": "alpha beta"})
    lines = tmp_path / "corpus.jsonl"
    lines.write_text(f"{row}\n")
    doc = tmp_path / "corpus.json"
    doc.write_text(f"[{row}]")
    assert len(load_corpus(lines)) == 1 and len(load_corpus(doc)) == 1
    lower(monkeypatch, "corpus", line=len(row) - 1, document=len(row))
    for path, said in ((lines, "a line over"), (doc, "over the")):
        with pytest.raises(UserError, match=f"corpus: cannot read .*{said}"):
            load_corpus(path)
    for argv in (["serve-retriever", f"corpus={lines}", "port=0"], ["eval", "env=qa", f"env.qa.corpus={lines}"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "corpus" in err and "the bound on a passage" in err, err
