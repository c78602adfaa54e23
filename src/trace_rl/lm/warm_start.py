"""The cached warm starts of the tiny CPU policy: `tiny` (= `tiny@0`) and `tiny@N`, the model `trace-rl sft seed=N`
trains with its default settings.

A warm start is a function of its seed, the code that builds it, the library versions that run it and the numerics
they run with. The cache is keyed by all four, so a warm start made by other code or other versions is never
reused in silence: it sits under another key and the current one is built (by `train`, which builds what it
needs) or asked for in one line (by the commands that only read a model). What makes the key:

- the seed;
- a digest of the code that decides the warm start (SFT's training and demonstrations, the calculator task, the
  tiny model and its tokenizer, the chat format, the seed streams; `SOURCES`), taken over the syntax trees without
  docstrings, so an edit to a comment, a docstring or the command's plumbing does not rebuild it while any change
  to that code or a default does;
- the versions of python, torch, transformers, tokenizers, safetensors and numpy;
- the numerics it is built with (`numerics()`).

Left to themselves, torch's kernels follow the machine: MKL picks its matrix-product code by processor, ATen its
vector kernels by the processor's widest instructions, and ATen's parallel reductions split the work by thread
count, so one seed trains other weights on another processor or thread count (measured: 1 and 2 threads differ
after 150 steps on one machine; two x86-64 machines, both AVX-512, built different weights from one key). So on an
Intel x86-64 processor with AVX2 the warm start is trained in a fresh process (`run_portable`) pinned to MKL's
AVX2 reproducibility mode (`MKL_CBWR=AVX2`, which MKL documents as giving the same results on Intel processors
that have AVX2), ATen's AVX2 kernels (`ATEN_CPU_CAPABILITY=avx2`) and one thread; the process checks that the pins
took. Measured on one processor only; a second is the check still to make (a stored digest in the tests makes any
other machine that runs them one). It costs about 2x the native build's time, once. Elsewhere (AMD, ARM, no AVX2,
no /proc/cpuinfo) the build is native and its key says so. The manifest (`warm_start.json`) records the thread
count and the processor (vendor, model, libc) with a digest of the weights and the SFT report's figures, so a run
can name the start it trained from.

The warm starts behind the published LM figures, tiny@0 and tiny@2, ship with the package (`SHIPPED`: the folder
`lm/shipped/tiny-seed<N>`, about 3.3 MB of float32 weights each): `resolve` returns them on every machine, whatever
its processor, library versions or cache, after checking their weights digest once per process, so an empty cache
starts from them without training and every machine trains from the same weights. Other seeds are built and cached
as above; `trace-rl sft seed=0` still rebuilds one and says whether its build matches the shipped digest (a build
on another processor or other library versions may not: the shipped weights are what the commands use). What
stays machine-dependent is the RL run itself (its matmuls follow the processor and the thread count).

Two processes never build one warm start at once: the builder holds a lock file beside the entry, builds into a
temporary folder and renames it into place; a second process waits on the lock and then reads the finished entry.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import hashlib
import json
import os
import pickle
import platform
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

from ..errors import ConfigError

TINY = "tiny"
MANIFEST = "warm_start.json"
# the code, relative to the package root, that decides what `trace-rl sft` trains: whole modules, or the named
# top-level definitions of a module whose other parts (the command's plumbing, hub access) do not touch the weights
SOURCES: dict[str, tuple[str, ...] | None] = {
    "train/sft.py": ("demo_sequence", "SFTParams", "train_sft", "_train_and_save", "_train_portable"),
    "envs/calculator.py": None,
    "envs/base.py": None,
    "lm/models.py": ("tiny_llama_config", "create_tiny_model"),
    "lm/tokenizer.py": None,
    "agent/react.py": None,
    "seeding.py": None,
}
LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors", "numpy")
# read by MKL, ATen and oneDNN when torch loads, so set when a fresh process starts (run_portable); oneDNN is not
# used for fp32 linear layers at the default precision, pinned all the same
PORTABLE_ENV = {
    "MKL_CBWR": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
# the pins are part of the name, so a change to them is a change of key
PORTABLE = "x86-64-intel:" + ",".join(f"{k}={v}" for k, v in sorted(PORTABLE_ENV.items()))
_NAME = re.compile(r"^tiny(?:@(\d+))?$")
# the warm starts the package ships, by SFT seed: the weights digest each must have (tests pin them too)
SHIPPED = {0: "28583b334b2ee00a", 2: "147fc1a5bcef3f6e"}
SHIPPED_ROOT = Path(__file__).resolve().parent / "shipped"
_CHECKED: set[int] = set()  # seeds whose shipped weights this process has checked


def parse_tiny(name: str) -> int | None:
    """'tiny' -> 0, 'tiny@3' -> 3 (the warm start's SFT seed); None for any other model name."""
    m = _NAME.match(name)
    return None if m is None else int(m.group(1) or 0)


def is_tiny(name: str) -> bool:
    return parse_tiny(name) is not None


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def code_digest(root: Path | None = None) -> str:
    """sha256 (16 hex digits) of the SOURCES' syntax trees without docstrings: code and defaults, not comments."""
    root = root or Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for rel, names in SOURCES.items():
        tree = _strip_docstrings(ast.parse((root / rel).read_text()))
        if names is not None:
            found = {getattr(node, "name", None): node for node in tree.body}
            missing = [n for n in names if n not in found]
            if missing:  # a renamed definition must be named here again, never silently left out of the key
                raise RuntimeError(f"warm_start.SOURCES names {missing} in {rel}, which does not define them")
            tree = ast.Module(body=[found[n] for n in names], type_ignores=[])
        h.update(rel.encode())
        h.update(ast.dump(tree).encode())
    return h.hexdigest()[:16]


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries a warm start depends on (read from the metadata, nothing imported)."""
    out = {"python": platform.python_version()}
    for lib in LIBRARIES:
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            out[lib] = "absent"
    return out


def cpu_info() -> tuple[str, str, set[str]]:
    """(vendor, model name, flags) of the first processor in /proc/cpuinfo; empty where there is none."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "", "", set()
    fields: dict[str, str] = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields.get("vendor_id", ""), fields.get("model name", ""), set(fields.get("flags", "").split())


def numerics() -> str:
    """The code paths this machine builds a warm start with: PORTABLE on an Intel x86-64 processor with AVX2 and FMA
    (MKL documents its AVX2 reproducibility mode for Intel processors; others take its automatic path), else
    `native-<machine>` (the kernels this processor picks; its weights may differ on another one)."""
    machine = platform.machine().lower()
    vendor, _, flags = cpu_info()
    intel_avx2 = machine in ("x86_64", "amd64") and vendor == "GenuineIntel" and {"avx2", "fma"} <= flags
    return PORTABLE if intel_avx2 else f"native-{machine}"


_WORKER = """
import importlib, pickle, sys
target, args = pickle.loads(open(sys.argv[1], "rb").read())
module, _, name = target.partition(":")
try:
    out = (True, getattr(importlib.import_module(module), name)(*args))
except BaseException as err:
    out = (False, err)
with open(sys.argv[2], "wb") as f:
    pickle.dump(out, f)
"""


def run_portable(target: str, *args: object) -> object:
    """`module:function`(*args) in a fresh python process started with PORTABLE_ENV (MKL and ATen read it when torch
    loads, so a process that has loaded torch cannot switch), and its result. Arguments and the result, or the
    exception, travel by pickle through a temporary folder. A process that dies without a result (killed, out of
    memory, an illegal instruction) is an error naming its exit code, never a wait."""
    with tempfile.TemporaryDirectory(prefix="trace-rl-portable-") as tmp:
        call, result = Path(tmp) / "call.pkl", Path(tmp) / "result.pkl"
        call.write_bytes(pickle.dumps((target, args)))
        env = {**os.environ, **PORTABLE_ENV}
        code = subprocess.run([sys.executable, "-c", _WORKER, str(call), str(result)], env=env, check=False).returncode
        if not result.is_file():
            raise RuntimeError(
                f"the process running {target} with portable numerics ended with exit code {code} and no result"
            )
        ok, value = pickle.loads(result.read_bytes())
    if not ok:
        raise value
    return value


def basis(seed: int, settings: dict | None = None) -> dict:
    """What a warm start is a function of. `settings`: non-default SFT settings (None: the defaults, which the
    code digest covers)."""
    return {
        "seed": seed,
        "settings": settings or "defaults",
        "code": code_digest(),
        "versions": library_versions(),
        "numerics": numerics(),
    }


def key_of(b: dict) -> str:
    return hashlib.sha256(json.dumps(b, sort_keys=True).encode()).hexdigest()[:12]


def cache_dir() -> Path:
    """The user cache of models and warm starts: TRACE_RL_CACHE, default ~/.cache/trace-rl."""
    return Path(os.environ.get("TRACE_RL_CACHE", Path.home() / ".cache" / "trace-rl"))


def cache_root() -> Path:
    return cache_dir() / "tiny-sft"


def entry_dir(seed: int, settings: dict | None = None) -> Path:
    """The cache entry of the warm start of `seed` (and non-default `settings`) for this code and these versions."""
    b = basis(seed, settings)
    prefix = f"seed{seed}" if settings is None else f"custom-seed{seed}"
    return cache_root() / f"{prefix}-{key_of(b)}"


def read_manifest(path: Path) -> dict | None:
    """The manifest of a finished entry, else None (an entry without one was never finished)."""
    f = Path(path) / MANIFEST
    if not f.is_file():
        return None
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def weights_digest(path: Path) -> str:
    """sha256 (16 hex digits) of the saved weights: the file's bytes, which safetensors writes deterministically."""
    h = hashlib.sha256()
    for f in sorted(Path(path).glob("*.safetensors")):
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (a `.lock` file beside it, flock: released by the kernel if the holder dies):
    one holder at a time, the others wait."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def shipped(seed: int) -> Path | None:
    """The shipped warm start of `seed` (None for a seed the package does not ship), its weights digest checked
    against `SHIPPED` once per process; one line when it is missing or damaged."""
    if seed not in SHIPPED:
        return None
    path = SHIPPED_ROOT / f"tiny-seed{seed}"
    if seed not in _CHECKED:
        if not read_manifest(path) or not (path / "model.safetensors").is_file():
            raise ConfigError(
                f"model: the shipped warm start tiny@{seed} is missing from {path} (an install without the package "
                f"data): reinstall trace-rl, or build it with `trace-rl sft seed={seed} out=DIR` and pass "
                "policy.model=DIR"
            )
        digest = weights_digest(path)
        if digest != SHIPPED[seed]:
            raise ConfigError(
                f"model: the shipped warm start tiny@{seed} in {path} has weights digest {digest}, not "
                f"{SHIPPED[seed]}: the file is damaged or replaced; reinstall trace-rl"
            )
        _CHECKED.add(seed)
    return path


def cached_elsewhere(seed: int) -> str:
    """The finished cache entries of `seed` under other keys (other code, library versions or numerics), named."""
    return ", ".join(sorted(p.name for p in cache_root().glob(f"seed{seed}-*") if read_manifest(p)))


def resolve(name: str) -> Path:
    """`tiny` / `tiny@N`: the shipped warm start of N where the package ships one (`shipped`), else the finished
    cache entry, or one line saying it is not built (and why, when the cache holds the seed's warm start for other
    code or versions)."""
    seed = parse_tiny(name)
    if seed is None:
        raise ConfigError(f"model: {name!r} is not tiny or tiny@N")
    ship = shipped(seed)
    if ship is not None:
        return ship
    entry = entry_dir(seed)
    if read_manifest(entry):
        return entry
    held = cached_elsewhere(seed)
    why = f"; the cache holds {held}, made by other code, library versions or numerics, not reused" if held else ""
    raise ConfigError(
        f"model: the warm start {name} for this code and these library versions is not built ({entry}){why}; "
        f"run `trace-rl sft seed={seed}` (train builds it itself)"
    )


def shipped_verdict(seed: int, digest: str) -> str:
    """One line on how a build of `seed` compares with the shipped warm start ("" where none is shipped)."""
    if seed not in SHIPPED:
        return ""
    if digest == SHIPPED[seed]:
        return f"this build matches the shipped warm start tiny@{seed} bit for bit (weights digest {digest})"
    return (
        f"this build's weights ({digest}) differ from the shipped warm start tiny@{seed} ({SHIPPED[seed]}): this "
        f"machine's processor or library versions ({numerics()}) compute other bits; every command still trains "
        f"from the shipped weights (policy.model=tiny@{seed}); pass this folder as policy.model to use this build"
    )


def describe(path: Path) -> dict:
    """What a run records of its start: the entry, its key, the weights digest, the SFT report's figure, the
    library versions and the numerics it was built with (None for an entry built before they were keyed)."""
    m = read_manifest(path) or {}
    return {
        "path": str(path),
        "key": m.get("key"),
        "weights_digest": m.get("weights_digest"),
        "sft_success": (m.get("report") or {}).get("overall"),
        "versions": m.get("versions"),
        "numerics": m.get("numerics"),
    }
