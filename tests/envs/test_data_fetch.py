"""`trace-rl fetch-data` against mirrors the tests build (a file:// folder and an http server on 127.0.0.1; never
the internet): pinned files are fetched, checked by SHA-256, reduced where shared/data reduces them, written
whole or not at all, and kept on a rerun; a mirror that serves other bytes is refused with one line."""

import hashlib
import json
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trace_rl.cli import main
from trace_rl.envs import data_fetch
from trace_rl.envs.data_fetch import FILES, Pinned, fetch, keep_fields
from trace_rl.errors import UserError

REPO = ("someone/data", "0" * 40)
ROWS = [{"problem": "1+1", "solution": "two", "answer": "2", "difficulty": 1.0}, {"problem": "é", "answer": "x"}]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def mirror(tmp_path, monkeypatch):
    """A mirror folder laid out as MIRROR/owner/repo/commit/path, and pins for what it holds."""
    root = tmp_path / "mirror"
    base = root / REPO[0] / REPO[1]
    (base / "test").mkdir(parents=True)
    eval_bytes = b'[{"problem": "2+2", "answer": "4"}]'
    train_bytes = json.dumps(ROWS).encode()
    (base / "test" / "aime.json").write_bytes(eval_bytes)
    (base / "train.json").write_bytes(train_bytes)
    (base / "LICENSE").write_bytes(b"MIT\n")
    reduced = keep_fields(train_bytes, ("problem", "answer"))
    pins = (
        Pinned("math/eval/aime.json", REPO, "test/aime.json", sha(eval_bytes)),
        Pinned("math/train/math.jsonl", REPO, "train.json", sha(reduced), sha(train_bytes), ("problem", "answer")),
        Pinned("qa/eval/other.jsonl", ("other/repo", "1" * 40), "x.jsonl", "f" * 64),  # not asked for below
        Pinned("LICENSES/someone__data.txt", REPO, "LICENSE", sha(b"MIT\n")),
    )
    monkeypatch.setattr(data_fetch, "FILES", pins)
    return root, pins


def test_fetch_writes_the_pinned_files_reduces_the_training_rows_and_keeps_them_on_a_rerun(tmp_path, mirror):
    root, pins = mirror
    out, lines = tmp_path / "data", []
    written = fetch(out, root.as_uri(), ["math"], pins, log=lines.append)
    assert sorted(p.relative_to(out).as_posix() for p in written) == [
        "LICENSES/someone__data.txt",
        "math/eval/aime.json",
        "math/train/math.jsonl",
    ]
    rows = [json.loads(line) for line in (out / "math/train/math.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rows == [{"problem": "1+1", "answer": "2"}, {"problem": "é", "answer": "x"}]  # fields dropped, UTF-8
    assert "é" in (out / "math/train/math.jsonl").read_text(encoding="utf-8")  # written unescaped, as upstream
    assert fetch(out, root.as_uri(), ["math"], pins, log=lines.append) == []  # all there and verified
    (out / "math/eval/aime.json").write_text("[]")  # damaged: fetched again
    assert fetch(out, root.as_uri(), ["math"], pins, log=lines.append) == [out / "math/eval/aime.json"]


def test_a_mirror_that_serves_other_bytes_is_refused_and_nothing_is_written(tmp_path, mirror):
    root, pins = mirror
    (root / REPO[0] / REPO[1] / "train.json").write_text('[{"problem": "tampered", "answer": "0"}]')
    out = tmp_path / "data"
    with pytest.raises(UserError, match=r"mirror: .*train.json has SHA-256 .* not the pinned .*; not written"):
        fetch(out, root.as_uri(), ["math"], pins, log=lambda line: None)
    assert not (out / "math/train/math.jsonl").exists() and not list(out.rglob(".*tmp*"))
    with pytest.raises(UserError, match="mirror: cannot fetch"):
        fetch(tmp_path / "other", (tmp_path / "absent").as_uri(), ["math"], pins, log=lambda line: None)


def test_fetch_over_http_from_a_local_server_and_a_missing_file_names_the_http_status(tmp_path, mirror):
    root, pins = mirror
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert len(fetch(tmp_path / "data", url, ["math"], pins, log=lambda line: None)) == 3
        with pytest.raises(UserError, match="HTTP 404"):
            fetch(tmp_path / "data", url, ["qa"], pins, log=lambda line: None)
    finally:
        server.shutdown()
        server.server_close()


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_the_command_fetches_from_a_mirror(tmp_path, mirror, capsys):
    root, _ = mirror
    assert main(["fetch-data", f"out={tmp_path / 'data'}", f"mirror={root.as_uri()}", "sets=math"]) == 0
    assert (tmp_path / "data" / "math/train/math.jsonl").is_file()
    assert "3 file(s) fetched" in capsys.readouterr().out


def test_the_pins_match_the_data_folder_where_it_is_here():
    from helpers_data import shared_data_or_skip

    root = shared_data_or_skip(*(f.dest for f in FILES))
    for f in FILES:
        assert sha((root / f.dest).read_bytes()) == f.sha256, f.dest
    assert {f.source_sha256 != "" for f in FILES if f.keep} == {True}  # a reduced file pins its upstream too
