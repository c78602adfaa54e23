"""`trace-rl fetch-data`: download the math and QA data sets (the `shared/data` folder the math and QA environments
read, see `data.data_root`) from the public repositories they come from, each file pinned to one commit and
checked by SHA-256 before it is written.

Each file is fetched from `MIRROR/<owner>/<repo>/<commit>/<path>` (raw.githubusercontent.com by default; a
`file://` folder or another http server with the same layout works too, which is how the tests run it offline).
The bytes fetched must match the pinned SHA-256 of the upstream file; two training files are then reduced as
they were for shared/data (a JSON array of rows becomes JSON lines, keeping only `problem`, `answer`,
`difficulty` and `type`) and the result must match its own pinned SHA-256. Nothing that fails a check is
written: each file goes to a temporary name and is renamed into place only when whole and verified, so an
interrupted fetch leaves complete files only and a rerun fetches only what is missing or wrong. The origins,
commits and licences are in docs/data-sources.md (SOURCES.md beside the data).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError, UserError

UPSTREAM = "https://raw.githubusercontent.com"
MAX_BYTES = 64 << 20  # the largest file is 2.4 MB: a reply this large is not the file
TRAIN_FIELDS = ("problem", "answer", "difficulty", "type")

DEEPSCALER = ("agentica-project/deepscaler", "95ef74ffee001cce89463f2d61dfdce1d03576c1")
QWEN_MATH = ("QwenLM/Qwen2.5-Math", "a45202bd16f1ec06f433442dc1152d0074773465")
R1_SEARCHER = ("RUCAIBox/R1-Searcher", "631167cbb3c2464f805730e3e364a690f5b136d4")
FIREACT = ("anchen1011/FireAct", "94c6189f04b10fccae6bcd97a4632d6119266899")
HIPPORAG = ("OSU-NLP-Group/HippoRAG", "b144c46df14cabe5f5822d8caded4bec5f709461")  # branch legacy


@dataclass(frozen=True)
class Pinned:
    """One file of the data folder: where it comes from and what its bytes must hash to."""

    dest: str  # path under the data folder
    source: tuple[str, str]  # (owner/repo, commit)
    path: str  # path in the repository
    sha256: str  # of the file as written
    source_sha256: str = ""  # of the upstream file, when it is reduced (`keep`); else the same as sha256
    keep: tuple[str, ...] = ()  # reduce a JSON array of rows to JSON lines of these fields

    @property
    def set(self) -> str:
        return self.dest.split("/", 1)[0] if not self.dest.startswith("LICENSES/") else "licenses"


def _p(dest, source, path, sha256, source_sha256="", keep=()) -> Pinned:
    return Pinned(dest, source, path, sha256, source_sha256, keep)


FILES = (
    _p("math/eval/aime.json", DEEPSCALER, "deepscaler/data/test/aime.json",
       "03fd341fee10fb71cf906be4eb3042081f314c4d16077489e41f9375085d20d2"),
    _p("math/eval/amc.json", DEEPSCALER, "deepscaler/data/test/amc.json",
       "2666a217cb566efb77ebfce61841d5d8855d4b4be89633b29df3a43dcfd942dd"),
    _p("math/eval/math.json", DEEPSCALER, "deepscaler/data/test/math.json",
       "02e232722dd1f9ab307124bfff40621d32193632b6b84aa9a246e701f0478141"),
    _p("math/eval/minerva.json", DEEPSCALER, "deepscaler/data/test/minerva.json",
       "ba6147602d8b2f9071ecf578e29aa1100c634bdfa982d4c6745c2bd3077554ba"),
    _p("math/eval/olympiad_bench.json", DEEPSCALER, "deepscaler/data/test/olympiad_bench.json",
       "c1e099f7b5830fb843fa52d48d0af8a296a94745cb5981b4ce539dd18af6f8ee"),
    _p("math/eval/amc23.jsonl", QWEN_MATH, "evaluation/data/amc23/test.jsonl",
       "43707e1ca784602d8479de24ee8ce36609dbebc46dd152b0b12a46611aa898a4"),
    _p("math/train/aime.jsonl", DEEPSCALER, "deepscaler/data/train/aime.json",
       "6637d2362e2dc1c1594a50983efefb58a1b22f685cd63c5125fd6e318a39444a",
       "78f1b9bae6d00794b43e79a5842917f7ef4e355d9b705743c61f255f3c7c5d49", TRAIN_FIELDS),
    _p("math/train/math.jsonl", DEEPSCALER, "deepscaler/data/train/math.json",
       "5eafb308ae6dfafc07d62c0cba8d0e7118d31c301f77ac594a7d809d7c177544",
       "569230b362fd501e1a33d8f29aae3b4b989d32e2b91b07c3f48493528c3bf6d2", TRAIN_FIELDS),
    _p("qa/eval/hotpotqa_500.jsonl", R1_SEARCHER, "data/eval_set/hotpotqa_500.jsonl",
       "bf8a42f6e1abcaaaf050cf3c7ffa50231102dd1c021b77ab01eeac95fad04bea"),
    _p("qa/eval/2wiki_500.jsonl", R1_SEARCHER, "data/eval_set/2wiki_500.jsonl",
       "0fb19dee8acbf146d60c699443b1164038727f9597f30f4894bab2da253b2f1a"),
    _p("qa/eval/musique_500.jsonl", R1_SEARCHER, "data/eval_set/musique_500.jsonl",
       "d1342802b9b9850e44a946031de4557722427783c92421178d729dd6e113b50d"),
    _p("qa/eval/bamboogle.jsonl", R1_SEARCHER, "data/eval_set/bamboogle.jsonl",
       "1c551e2f4c3387fd97a1cf711737258df5ffd4ea86996f1b2ba63a861cb7af29"),
    _p("qa/train/stage_1.jsonl", R1_SEARCHER, "data/training_set/stage_1.jsonl",
       "17d9eee9de22a25152ca0445fc9d7da06dde1f74ef44fb997d173c45d26d29f7"),
    _p("qa/train/stage_2.jsonl", R1_SEARCHER, "data/training_set/stage_2.jsonl",
       "25ef0a7f3b91d36e87b46f269f039b5307e89a87b12a6ee5102fb93619286219"),
    _p("qa/eval/hotpotqa_dev_full.json", FIREACT, "data/hotpotqa/dev.json",
       "05001dcdeb2b2b2243a88f23daaf8de9237494cd387e13bc25854d3e031101d3"),
    _p("qa/corpus/hotpotqa_train.json", HIPPORAG, "data/hotpotqa_train.json",
       "6c0e2689d03c94b3bb4d5f94ed806ea4f4eb4f46c12132f8e91df774ad5c5a22"),
    _p("qa/corpus/hotpotqa_train_corpus.json", HIPPORAG, "data/hotpotqa_train_corpus.json",
       "2671af600095eabc5b3f3bc3728861682f14fcced84ef1386509a8ae92647f88"),
    _p("qa/corpus/musique_train.json", HIPPORAG, "data/musique_train.json",
       "bca674746844637f5c68408a96b67bc0542d98e7c53715f3acafe144bd5e4ff4"),
    _p("qa/corpus/musique_train_corpus.json", HIPPORAG, "data/musique_train_corpus.json",
       "79845dd085f9df49c8ce440208763e2611aeb86c81ee0bdad2094504381bb651"),
    _p("LICENSES/agentica-project__deepscaler.txt", DEEPSCALER, "LICENSE",
       "ff6942a73920abc865204c0936e115adc5c84c51e2c2b2c6b6b371fc967de787"),
    _p("LICENSES/QwenLM__Qwen2.5-Math.txt", QWEN_MATH, "evaluation/LICENSE",
       "fad7c7435d19a4c635225d0d64915c12175608f44c68eedc62eaa5253bf43b79"),
    _p("LICENSES/RUCAIBox__R1-Searcher.txt", R1_SEARCHER, "LICENSE",
       "fb0815164143f296d7cc06499237c63175387fdfd5666bcb36af20886e26cee2"),
    _p("LICENSES/anchen1011__FireAct.txt", FIREACT, "LICENSE",
       "2aaff10819d8fa5b2b2d0687f6d66da2e1b63c8a25222fe97212452306842131"),
    _p("LICENSES/OSU-NLP-Group__HippoRAG.txt", HIPPORAG, "LICENSE",
       "05b8ae666b03e1a86252324c5207b872b37272c3c47cbc3f27b19debd35597cf"),
)  # fmt: skip
SETS = ("math", "qa")  # the licences of the repositories a set comes from are always fetched with it


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def keep_fields(data: bytes, fields: Iterable[str]) -> bytes:
    """A JSON array of rows as JSON lines of `fields` only (in that order, where present), UTF-8 unescaped:
    how shared/data's training files were made from their upstream arrays."""
    rows = json.loads(data.decode("utf-8"))
    keep = tuple(fields)
    return "".join(json.dumps({k: r[k] for k in keep if k in r}, ensure_ascii=False) + "\n" for r in rows).encode()


def _download(url: str, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:  # noqa: S310 - http(s) or file:// by design
            data = reply.read(MAX_BYTES + 1)
    except urllib.error.HTTPError as err:
        raise UserError(f"mirror: {url} answered HTTP {err.code} ({err.reason})") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise UserError(f"mirror: cannot fetch {url} ({getattr(err, 'reason', None) or err})") from None
    if len(data) > MAX_BYTES:
        raise UserError(f"mirror: {url} is larger than {MAX_BYTES} bytes; not a file of this data set")
    return data


def _is_current(path: Path, sha256: str) -> bool:
    try:
        return path.is_file() and _sha256(path.read_bytes()) == sha256
    except OSError:
        return False


def fetch(
    out: str | Path,
    mirror: str = UPSTREAM,
    sets: Iterable[str] = SETS,
    files: Iterable[Pinned] | None = None,
    timeout: float = 60.0,
    log: Callable[[str], None] = print,
) -> list[Path]:
    """Fetch every pinned file of `sets` (and the licences of their repositories) into `out`; a file already
    there with the pinned SHA-256 is kept. UserError naming the URL or the file at the first that fails."""
    root = Path(out)
    files = FILES if files is None else tuple(files)
    wanted = [f for f in files if f.set in sets]
    repos = {f.source for f in wanted}
    wanted += [f for f in files if f.set == "licenses" and f.source in repos]
    written = []
    for f in wanted:
        target = root / f.dest
        if _is_current(target, f.sha256):
            log(f"{f.dest}: already here")
            continue
        url = f"{mirror.rstrip('/')}/{f.source[0]}/{f.source[1]}/{f.path}"
        data = _download(url, timeout)
        want = f.source_sha256 or f.sha256
        if _sha256(data) != want:
            raise UserError(
                f"mirror: {url} has SHA-256 {_sha256(data)[:16]}..., not the pinned {want[:16]}...; not written"
            )
        if f.keep:
            data = keep_fields(data, f.keep)
            if _sha256(data) != f.sha256:  # the reduction itself changed: a bug here, not a bad download
                raise RuntimeError(f"{f.dest}: the reduced file does not match its pinned SHA-256")
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            os.replace(tmp, target)  # whole and verified, or not there
        except OSError as err:
            tmp.unlink(missing_ok=True)
            raise ConfigError(f"out: cannot write {target} ({err.strerror or err})") from None
        log(f"{f.dest}: {len(data):,} bytes from {f.source[0]}@{f.source[1][:7]}")
        written.append(target)
    return written


@dataclass
class FetchDataConfig:
    """`trace-rl fetch-data`: download the math and QA data sets, pinned to upstream commits and SHA-256 checked."""

    out: str = ""  # the data folder (default: $TRACE_RL_DATA, else shared/data beside the checkout)
    sets: list[str] = field(default_factory=lambda: ["math", "qa"])  # which data sets: math, qa
    mirror: str = UPSTREAM  # files are read from MIRROR/owner/repo/commit/path

    def __post_init__(self):
        unknown = [s for s in self.sets if s not in SETS]
        if unknown or not self.sets:
            raise ValueError(f"sets: unknown {unknown or 'none given'}; choose from {', '.join(SETS)}")
        if not self.mirror.startswith(("https://", "http://", "file://")):
            raise ValueError(f"mirror: an https://, http:// or file:// URL, got {self.mirror!r}")


def run_fetch(cfg: FetchDataConfig) -> list[Path]:
    """The command: fetch into `out` (or the default folder) and say where the environments will find it."""
    from .data import data_root, default_data_dir

    out = Path(cfg.out) if cfg.out else default_data_dir()
    written = fetch(out, cfg.mirror, cfg.sets)
    print(f"{out}: {len(written)} file(s) fetched, the rest already there and verified")
    try:
        found = data_root().resolve() == out.resolve()
    except UserError:
        found = False
    if not found:
        print(f"the environments read {out} when TRACE_RL_DATA={out} is set", file=sys.stderr)
    return written
