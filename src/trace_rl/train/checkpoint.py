"""Checkpoints that never load wrongly: `out/global_step_N/` is written under a temporary name and renamed
when complete, so a directory with that name is always whole (a kill at any moment leaves at most a
`.tmp-*` directory, which is ignored and removed). `keep_last` bounds the disk.

A checkpoint holds what the next step reads: the policy (`save_pretrained`), the optimizer state, the
predictor (pickled: numpy state, its replay window and random stream), the trainer state (`RunState`, as
trainer_state.json: the step, which is also the data position, since pools are drawn per step from the run's seed,
and the online calibration layers' states), the RNG states of python, numpy and
torch, and the resolved config. Pickles are read back only from the run's own directory; never load a
checkpoint from a source you do not trust.

Damage after the write (a disk that truncates or garbles a file, a copy cut short) is caught on load:
`manifest.json`, written last, lists every file with its size and SHA-256, and `resume_point` skips a
checkpoint whose files do not match it (one line naming the file) for the newest intact one; a skipped one is
renamed `global_step_N.damaged`, kept for a look but no longer counted by `keep_last`. Hashing reads
every byte once per resume, about a second per GB. Checkpoints written before the manifest existed are
accepted with a one-line warning; their damage is still caught where reading a file fails (a truncated
safetensors file, a garbage pickle, broken JSON), not where a file was altered but still parses. Everything is
read before anything is applied, so a damaged checkpoint never leaves a half-restored model; the weights are
held twice in host memory for that moment.

A checkpoint also says whose it is: the manifest records the run (its seed, a digest of the settings that
determine what it computes, and those settings) and the step, and `resume_point` refuses one that belongs to
another run (a symlink to another seed's checkpoint) or another step (`global_step_2` copied to
`global_step_8`), with one line saying which setting or step differs. A newer foreign or misnamed one is moved
aside (`.foreign`, `.damaged`) and the newest checkpoint of this run is loaded; when none is this run's, the
resume stops with one line and nothing is moved. Manifests written before the run was recorded are accepted
with one line saying the run was not checked (the step still is). Anything under `global_step_N` that is not
a directory (a file, a dangling symlink) is moved aside with one line, and no file is read unless it is a
regular file (`safe_read`), so a FIFO in place of a file fails at once instead of blocking the resume.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UserError
from ..safe_read import check_regular, read_json
from ..stack.env_config import upgrade_run_settings

_NAME = re.compile(r"^global_step_(\d+)$")
MANIFEST = "manifest.json"
FORMAT = 2  # 1: files and step; 2: also the run (seed, settings digest, settings)
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def entries(out: str | Path) -> list[tuple[int, Path]]:
    """Everything named `global_step_N` under `out`, whatever it is (a directory, a file, a dangling symlink),
    oldest first: what a resume must look at, so that nothing in the way of a later save goes unnoticed."""
    root = Path(out)
    if not root.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _NAME.match(p.name)))


def checkpoints(out: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under `out` (directories, or symlinks to one), oldest first."""
    return [(step, p) for step, p in entries(out) if p.is_dir()]


def _write_files(path: Path, model, tokenizer, optimizer, predictor, state: dict, config_yaml: str) -> None:
    import torch

    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    torch.save(optimizer.state_dict(), path / "optimizer.pt")
    with open(path / "predictor.pkl", "wb") as fh:
        pickle.dump(predictor, fh)
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    with open(path / "rng.pkl", "wb") as fh:
        pickle.dump(rng, fh)
    (path / "trainer_state.json").write_text(json.dumps(state, indent=2))
    (path / "config.yaml").write_text(config_yaml)


def save_checkpoint(
    out: str | Path,
    step: int,
    model,
    tokenizer,
    optimizer,
    predictor,
    state: dict,
    config_yaml: str,
    keep_last: int = 2,
    run: dict | None = None,
) -> Path:
    """Write `out/global_step_{step}` atomically; then drop all but the `keep_last` newest. `run` (`run_record`:
    seed, settings digest, settings) goes into the manifest, so a resume can tell this run's checkpoints from
    another's."""
    root = Path(out)
    final = root / f"global_step_{step}"
    tmp = root / f".tmp-global_step_{step}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        _write_files(tmp, model, tokenizer, optimizer, predictor, state, config_yaml)
        for f in tmp.iterdir():  # on disk before the manifest vouches for them
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        _write_manifest(tmp, step, run)  # last: its presence says every other file was complete
    except (OSError, RuntimeError) as err:  # a full disk, a quota, an I/O error (torch's writer: RuntimeError)
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            kept = checkpoints(root)
        except OSError:
            kept = []
        previous = f"the previous checkpoint {kept[-1][1]} is kept" if kept else "there is no earlier checkpoint"
        why = getattr(err, "strerror", None) or (str(err).splitlines() or [type(err).__name__])[0]
        raise CheckpointSaveError(f"checkpoint: could not save step {step} in {root} ({why}); {previous}") from None
    if final.is_symlink() or (final.exists() and not final.is_dir()):
        # a link (maybe to another run's checkpoint) or a stray file: moved aside, never followed or deleted
        os.replace(final, _free_name(final.with_name(f"{final.name}.damaged")))
    elif final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for _, old in checkpoints(root)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-global_step_*"):  # left by a process killed while writing
        shutil.rmtree(stale, ignore_errors=True)
    return final


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file() and p.name != MANIFEST)


def _write_manifest(path: Path, step: int, run: dict | None = None) -> None:
    files = {str(f.relative_to(path)): {"bytes": f.stat().st_size, "sha256": _sha256(f)} for f in _files(path)}
    manifest = {"format": FORMAT, "step": step, "files": files}
    if run is not None:
        manifest["run"] = run
    with open(path / MANIFEST, "w") as fh:
        json.dump(manifest, fh, indent=1, allow_nan=False)
        fh.flush()
        os.fsync(fh.fileno())


def run_record(seed: int, settings: dict) -> dict:
    """What identifies a run in its checkpoints: the seed, and the settings that determine what it computes
    (with a digest, so that equal settings are one string compare; the settings themselves name what differs)."""
    text = json.dumps(settings, sort_keys=True, default=str, allow_nan=False)
    return {"seed": seed, "settings_digest": hashlib.sha256(text.encode()).hexdigest()[:16], "settings": settings}


class CheckpointSaveError(UserError):
    """Writing a checkpoint failed (a full disk, ...): one line naming the step, the cause and what is kept."""


class CheckpointError(Exception):
    """A checkpoint that cannot be used; the message names the file and what is wrong with it."""


class ForeignCheckpoint(CheckpointError):
    """An intact checkpoint of another run (another seed or other settings)."""


def _manifest_entries(manifest: Path) -> tuple[dict, list[tuple[str, int, str]]]:
    """(the manifest, its files as (name, bytes, sha256)), every field type-checked; CheckpointError otherwise."""
    try:
        doc = read_json(manifest)
        files = doc["files"]
        if not isinstance(files, dict):
            raise TypeError("files is not an object")
        out = []
        for name, e in files.items():
            size, digest = e["bytes"], e["sha256"]
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise TypeError(f"bytes of {name} is {str(size)[:20]}, not a byte count")
            if not isinstance(digest, str) or not _HEX64.match(digest):
                raise TypeError(f"sha256 of {name} is not a SHA-256 digest")
            if Path(name).is_absolute() or ".." in Path(name).parts or not name:
                raise TypeError(f"{name[:60]!r} is not a path inside the checkpoint")
            out.append((name, size, digest))
        if "step" in doc and (isinstance(doc["step"], bool) or not isinstance(doc["step"], int)):
            raise TypeError("step is not an integer")
        if "run" in doc and not isinstance(doc["run"], dict):
            raise TypeError("run is not an object")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        what = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        raise CheckpointError(f"{manifest}: unreadable ({type(err).__name__}: {what})") from None
    return doc, out


def verify_checkpoint(path: Path) -> bool:
    """True when every file matches the manifest; False for a checkpoint without one (written before manifests
    existed); CheckpointError naming the first file that is missing, cut short or altered."""
    manifest = path / MANIFEST
    if not manifest.exists() and not manifest.is_symlink():
        return False
    _, files = _manifest_entries(manifest)
    for name, size, digest in files:
        f = path / name
        try:
            check_regular(f)
        except FileNotFoundError:
            raise CheckpointError(f"{f}: missing") from None
        except OSError as err:
            raise CheckpointError(str(err)) from None
        if f.stat().st_size != size:
            raise CheckpointError(f"{f}: {f.stat().st_size} bytes, the manifest says {size}")
        if _sha256(f) != digest:
            raise CheckpointError(f"{f}: contents differ from the manifest (SHA-256)")
    return True


def setting_differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two nested settings dicts."""
    out = []
    for k in sorted(set(a) | set(b)):
        if isinstance(a.get(k), dict) and isinstance(b.get(k), dict):
            out += setting_differences(a[k], b[k], f"{prefix}{k}.")
        elif a.get(k) != b.get(k):
            out.append(f"{prefix}{k}")
    return out


def check_identity(path: Path, step: int, state: dict, run: dict | None) -> str:
    """Whether the checkpoint at `path` is step `step` of the run `run` (`run_record`): CheckpointError when its
    manifest or trainer state names another step (a copy under another name), ForeignCheckpoint when it names
    another seed or other settings; a line to warn with when its manifest predates run records, else ''."""
    if state.get("step") != step:
        raise CheckpointError(f"{path / 'trainer_state.json'}: says step {state.get('step')}, not {step} as named")
    manifest = path / MANIFEST
    if not manifest.exists():
        return ""  # no manifest at all: resume_point already says so
    doc, _ = _manifest_entries(manifest)
    if doc.get("step", step) != step:
        raise CheckpointError(f"{manifest}: says step {doc['step']}, not {step} as named (a copy under another name)")
    if run is None:
        return ""
    theirs = doc.get("run")
    if theirs is None:
        return f"{path}: written before checkpoints recorded their run; its seed and settings were not checked"
    if theirs.get("seed") != run["seed"]:
        raise ForeignCheckpoint(f"{path}: a checkpoint of another run (seed {theirs.get('seed')}, not {run['seed']})")
    if theirs.get("settings_digest") != run["settings_digest"]:
        other = upgrade_run_settings(theirs.get("settings"))
        if other == run["settings"]:  # written before each env had its own settings group: the same run
            return ""
        diff = setting_differences(other, run["settings"]) if isinstance(other, dict) else []
        said = f"settings differ in {', '.join(diff[:4])}" if diff else "other settings"
        raise ForeignCheckpoint(f"{path}: a checkpoint of another run ({said})")
    return ""


@dataclass
class Checkpoint:
    """Everything a checkpoint holds, read into memory and not yet applied."""

    step: int
    path: Path
    weights: dict
    optimizer: dict
    predictor: Any
    rng: dict
    state: dict
    verified: bool  # False: written before manifests existed, read unchecked
    note: str = ""  # a line to warn with (a manifest that predates run records)


def read_checkpoint(path: Path, step: int, run: dict | None = None) -> Checkpoint:
    """Verify and read every file of a checkpoint, and check it is step `step` of `run` (when given);
    CheckpointError names the file that cannot be read, ForeignCheckpoint the run it belongs to."""
    import torch
    from safetensors.torch import load_file

    if not path.is_dir():
        what = "a dangling symlink" if path.is_symlink() and not path.exists() else "not a directory"
        raise CheckpointError(f"{path}: {what}, not a checkpoint")
    verified = verify_checkpoint(path)

    def read(name: str, how):
        try:
            check_regular(path / name)  # a FIFO would block the reader for ever
            return how(path / name)
        except Exception as err:  # noqa: BLE001 - unpickling and deserialising raise anything on garbage
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise CheckpointError(f"{path / name}: unreadable ({type(err).__name__}: {first[:200]})") from None

    def pickled(p: Path):
        with open(p, "rb") as fh:
            return pickle.load(fh)

    safetensors = (path / "model.safetensors").exists()
    weights = read(
        "model.safetensors" if safetensors else "pytorch_model.bin",
        (lambda p: load_file(p, device="cpu")) if safetensors else (lambda p: torch.load(p, map_location="cpu")),
    )
    optimizer = read("optimizer.pt", lambda p: torch.load(p, map_location="cpu", weights_only=False))
    predictor = read("predictor.pkl", pickled)
    rng = read("rng.pkl", pickled)
    state = read("trainer_state.json", lambda p: read_json(p, strict=False))  # a NaN standard error is in it
    if not isinstance(state, dict) or isinstance(state.get("step"), bool) or not isinstance(state.get("step"), int):
        raise CheckpointError(f"{path / 'trainer_state.json'}: no step in it")
    if not isinstance(rng, dict) or not {"python", "numpy", "torch"} <= set(rng):
        raise CheckpointError(f"{path / 'rng.pkl'}: not the RNG states of python, numpy and torch")
    note = check_identity(path, step, state, run)
    return Checkpoint(step, path, weights, optimizer, predictor, rng, state, verified, note)


def resume_point(out: str | Path, warn: Callable[[str], None] | None = None, run: dict | None = None) -> Checkpoint:
    """The newest checkpoint under `out` that verifies, reads back and (given `run`, a `run_record`) belongs to
    this run at the step it is named for. Each one skipped, and each one accepted without a manifest or without
    a run record, costs one line to `warn`; UserError when none is usable, or when every intact one is another
    run's (then nothing is moved: the settings, not the checkpoints, are likely what is wrong)."""
    warn = warn or (lambda line: None)
    skipped: list[tuple[Path, str]] = []
    foreign: list[str] = []
    lines: list[str] = []  # said once the outcome is known: a refusal of every checkpoint is its one line
    for step, path in reversed(entries(out)):
        try:
            ckpt = read_checkpoint(path, step, run)
        except ForeignCheckpoint as err:
            lines.append(f"skipping a checkpoint of another run: {err}")
            skipped.append((path, "foreign"))
            foreign.append(str(err))
            continue
        except CheckpointError as err:
            lines.append(f"skipping a damaged checkpoint: {err}")
            skipped.append((path, "damaged"))
            continue
        for line in lines:
            warn(line)
        if not ckpt.verified:
            warn(f"{path} has no {MANIFEST} (written before checkpoints were verified): loaded unchecked")
        elif ckpt.note:
            warn(ckpt.note)
        for bad, why in skipped:  # kept for a look, but out of the way: a later save must not prune or hit them
            os.replace(bad, _free_name(bad.with_name(f"{bad.name}.{why}")))
        return ckpt
    if foreign:  # the settings, not the checkpoints, are likely what is wrong: this line alone
        raise UserError(
            f"resume: no checkpoint in {out} is this run's ({foreign[0]}); resume with the settings it was run "
            "with, or choose another out"
        )
    for line in lines:
        warn(line)
    raise UserError(
        f"out: no usable checkpoint in {out} ({', '.join(p.name for p, _ in skipped)} damaged or foreign); move "
        "them away to start over, or choose another out"
    )


def _free_name(path: Path) -> Path:
    """`path`, or `path` with a number appended when something (even a dangling symlink) holds that name."""
    base, n = path.name, 1
    while path.exists() or path.is_symlink():
        n += 1
        path = path.with_name(f"{base}{n}")
    return path


def restore(ckpt: Checkpoint, model, optimizer) -> None:
    """Apply a read checkpoint: the model's weights, the optimizer and the RNG states, in place."""
    import torch

    missing, unexpected = model.load_state_dict(ckpt.weights, strict=False)
    if unexpected or any("lm_head" not in k for k in missing):  # a tied lm_head is not saved separately
        raise UserError(
            f"policy.model: the checkpoint {ckpt.path} does not match the model "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]}); resume with the run's own policy.model"
        )
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    optimizer.load_state_dict(ckpt.optimizer)
    random.setstate(ckpt.rng["python"])
    np.random.set_state(ckpt.rng["numpy"])
    torch.set_rng_state(ckpt.rng["torch"])
    ckpt.weights = {}  # the model holds them now


LAYERS = ("flip_model", "root_model")  # the engine's online calibration layers: RunState keeps each one's state


@dataclasses.dataclass
class RunState:
    """What a run has reached, saved in each checkpoint as trainer_state.json and read back on resume: the step
    (also the data position: pools are drawn per step from the seed), the evaluation before training, rollouts
    spent, the digests of the held-out tasks and of the pools so far (`compare` checks that paired runs share
    them), and the calibrated layers' states. The file's keys are these fields' names; a checkpoint written
    before a field existed reads it as its default."""

    step: int = 0
    accuracy_before: float | None = None
    rollouts: int = 0
    pools_digest: str = ""
    held_out_digest: str = ""
    before: dict | None = None  # the evaluation before training (accuracy and its standard errors)
    flip_model: dict | None = None  # experimental.flip's state, with predictor.flip_model=calibrated
    root_model: dict | None = None  # experimental.root_calibration's state, with predictor.root_model=calibrated

    def to_json(self) -> dict:
        """The trainer_state.json document; `before` and the layers' states only when set (as files always held)."""
        doc = dataclasses.asdict(self)
        return {k: v for k, v in doc.items() if v is not None or k not in ("before", *LAYERS)}

    @classmethod
    def from_json(cls, doc: dict) -> RunState:
        """From a checkpoint's trainer_state.json (`checkpoint.read_checkpoint` has checked its step)."""
        return cls(**{f.name: doc[f.name] for f in dataclasses.fields(cls) if f.name in doc})
