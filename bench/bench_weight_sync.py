"""The host side of a vLLM weight sync (`policy.vllm.weight_sync=direct`), timed against model size on this machine,
without vLLM: what `VLLMBackend._load_state_dict` and `vllm_weights.pack` do to the trainer's state dict, plus the
one copy into the message that vLLM's msgpack encoder then makes (timed here as a join of the packed bytes).

    PYTHONPATH=src python bench/bench_weight_sync.py --shapes tiny,smollm2-135m,qwen2.5-0.5b --repeats 3

On a GPU the first step, `.to("cpu").contiguous()`, is a device-to-host copy of every float32 weight; on CPU it is
no copy at all, so this bench times it as a host copy (`clone`), which bounds it from below on a GPU (a PCIe 5 x16
device-to-host copy moves about 50 GB/s at best, host memcpy more). The engine's own copy out of the message and its
load into the engine's dtype happen in the engine's process and are not timed. Shapes are Llama configurations of
those sizes with random float32 weights (no model is loaded or downloaded).
"""

from __future__ import annotations

import argparse
import statistics
import time

SHAPES = {  # hidden, layers, heads, kv heads, intermediate, vocab (tied embeddings)
    "tiny": (128, 4, 4, 4, 352, 148),
    "smollm2-135m": (576, 30, 9, 3, 1536, 49152),
    "qwen2.5-0.5b": (896, 24, 14, 2, 4864, 151936),
}


def state_dict(shape: str) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    h, layers, heads, kv, inter, vocab = SHAPES[shape]
    cfg = LlamaConfig(hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                      intermediate_size=inter, vocab_size=vocab, tie_word_embeddings=True)  # fmt: skip
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in LlamaForCausalLM(cfg).state_dict().items()}
    return {k: torch.randn(s) for k, s in shapes.items()}


def time_sync(state: dict, repeats: int) -> dict:
    from trace_rl.backends.vllm_weights import pack

    copy_s, pack_s, message_s = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        host = {k: v.detach().clone().contiguous() for k, v in state.items()}  # the GPU's device-to-host copy
        t1 = time.perf_counter()
        buffers = pack(host)[3]
        t2 = time.perf_counter()
        message = b"".join(buffers)  # the encoder's copy of the bytes into its message
        t3 = time.perf_counter()
        copy_s.append(t1 - t0), pack_s.append(t2 - t1), message_s.append(t3 - t2)
        del host, buffers, message
    nbytes = sum(v.numel() * v.element_size() for v in state.values())
    med = statistics.median
    return {"params": sum(v.numel() for v in state.values()), "bytes": nbytes, "copy_s": med(copy_s),
            "pack_s": med(pack_s), "message_s": med(message_s)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="tiny,smollm2-135m,qwen2.5-0.5b")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print("| shape | parameters | float32 MB | host copy s | pack s | message copy s | total s | GB/s |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        r = time_sync(state_dict(shape), args.repeats)
        total = r["copy_s"] + r["pack_s"] + r["message_s"]
        print(f"| {shape} | {r['params'] / 1e6:.2f}M | {r['bytes'] / 1e6:,.1f} | {r['copy_s']:.4f} | "
              f"{r['pack_s']:.5f} | {r['message_s']:.4f} | {total:.4f} | {r['bytes'] / total / 1e9:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
