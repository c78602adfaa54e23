"""`trace-rl serve-retriever`: a Search-R1-compatible /retrieve server (`envs.retrieval_server`) over a passage
corpus, BM25 or dense; loopback only unless asked, since the server has no authentication."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..envs.retrieval_server import is_loopback
from ..errors import ConfigError


@dataclass
class ServeRetrieverConfig:
    """`trace-rl serve-retriever`: a Search-R1-compatible /retrieve server over a passage corpus."""

    corpus: str = ""  # HotpotQA {title: sentences} or a list of {title, text}
    host: str = "127.0.0.1"  # listen address (loopback unless you ask otherwise)
    allow_remote: bool = False  # allow a non-loopback host (the server has no authentication)
    port: int = 8000  # listen port (0: any free port)
    dense: bool = False  # faiss + encoder instead of BM25
    encoder: str = "all-minilm-l6-v2"  # the dense retriever's sentence encoder

    def __post_init__(self):
        if not self.corpus:
            raise ValueError("corpus: give a passage corpus file")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.dense and self.encoder.startswith((".", "/", "~")) and not Path(self.encoder).expanduser().is_dir():
            raise ValueError(f"encoder: no directory {self.encoder} (give a local encoder or 'all-minilm-l6-v2')")
        if not self.allow_remote and not is_loopback(self.host):  # serve() checks it again; here before any work
            raise ValueError(
                f"host: {self.host!r} is not a loopback address; the server has no authentication, so serving "
                "beyond this machine needs allow_remote=true"
            )


def run(cfg: ServeRetrieverConfig, yaml_text: str = "") -> None:
    """Check a named dense encoder loads, build the index and serve until interrupted (the KeyboardInterrupt
    reaches the dispatcher, which says 'stopped'); it never returns a summary, since it serves until stopped."""
    if cfg.dense and cfg.encoder != "all-minilm-l6-v2":
        from ..lm.models import check_model

        try:  # in seconds, before the corpus is read: an unknown hub id offline is not left to the hub's retries
            check_model(cfg.encoder)
        except ValueError as err:
            raise ConfigError(f"encoder: {str(err).removeprefix('model: ')}") from None
    import socket
    import time

    from ..envs.retrieval import BM25Retriever, DenseRetriever, load_corpus
    from ..envs.retrieval_server import serve

    passages = load_corpus(cfg.corpus)  # a corpus it cannot read is a ConfigError naming `corpus`
    if cfg.dense:
        try:
            retriever = DenseRetriever(passages, cfg.encoder)
        except OSError as err:  # transformers: no such directory, no config.json, or not on the hub (offline)
            raise ConfigError(f"encoder: cannot load {cfg.encoder!r} ({str(err).strip().splitlines()[0]})") from None
    else:
        retriever = BM25Retriever(passages)
    try:
        server = serve(retriever, cfg.host, cfg.port, allow_remote=cfg.allow_remote)
    except socket.gaierror:
        raise ConfigError(f"host: cannot resolve {cfg.host!r}") from None
    except OSError as err:
        raise ConfigError(f"port: cannot listen on {cfg.host}:{cfg.port} ({err.strerror or err})") from None
    print(f"serving {len(passages)} passages on http://{cfg.host}:{server.server_address[1]}/retrieve (Ctrl-C stops)")
    try:
        while True:
            time.sleep(3600)
    finally:
        server.shutdown()
