"""One way to derive random streams from the run's seed: `numpy.random.SeedSequence` spawn keys.

Every random stream of a run (data order, a prompt's rollouts, a step's allocation ties, an episode's
sampling) is named by a path of small integers or strings under the run's seed, so the streams are
independent of each other and of the order in which asyncio or a thread pool happens to run the work:
one seed gives every draw the same stream on any machine whatever its speed. (Whether a model's log-probs also
match to the last bit depends on the processor and the thread count: docs/design.md, "What reproduces bit for bit".)
"""

from __future__ import annotations

import zlib

import numpy as np

MAX_SEED = 2**32 - 1  # what every consumer of a run's seed takes: numpy's legacy seeding, torch, vLLM


def check_seed(seed: int, key: str = "seed") -> None:
    """A run's seed: an integer in 0..MAX_SEED (the one check every command's seed settings go through)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"{key} must be an integer in 0..{MAX_SEED}, got {seed!r}")


def _key(part: int | str) -> int:
    if isinstance(part, str):
        return zlib.crc32(part.encode())  # stable across processes, unlike hash()
    if part < 0:
        raise ValueError(f"seed path parts must be >= 0, got {part}")
    return int(part)


def seed_sequence(seed: int, *path: int | str) -> np.random.SeedSequence:
    """The SeedSequence of the stream named `path` under `seed`."""
    return np.random.SeedSequence(int(seed), spawn_key=tuple(_key(p) for p in path))


def derive_seed(seed: int, *path: int | str) -> int:
    """A 63-bit integer seed for the stream named `path` under `seed` (for torch generators and backends)."""
    return int(seed_sequence(seed, *path).generate_state(1, np.uint64)[0] >> np.uint64(1))


def derive_rng(seed: int, *path: int | str) -> np.random.Generator:
    """A numpy Generator for the stream named `path` under `seed`."""
    return np.random.default_rng(seed_sequence(seed, *path))
