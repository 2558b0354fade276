"""The ``Loader``'s options, checked before anything is read: each error names the option, the
value given and what it may be (``ndp.errors.ConfigError``); and whether a remote dataset's
``cache_limit`` holds the shards the Loader's windows read at once."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from ndp.errors import CacheFullError, ConfigError
from ndp.loader.order import shards_at_once

MODES = ("padded", "packed", "packing")


def check_options(*, mode: str, batch_size: int, seq_len: int, prefetch: int, seed: int,
                  pad_token_id: int, chunk_batches: int | None, vocab_size: int | None,
                  output: str) -> None:
    """``ConfigError`` for a mode, integer or output the Loader cannot work with; torch
    imported now if the batches are to be torch tensors, so a missing torch is said at once."""
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {MODES}, got {mode!r}")
    for name, value, least in (("batch_size", batch_size, 1), ("seq_len", seq_len, 1),
                               ("prefetch", prefetch, 0), ("seed", seed, 0),
                               ("pad_token_id", pad_token_id, None),
                               ("chunk_batches", chunk_batches, 1),
                               ("vocab_size", vocab_size, 1)):
        if value is None and name in ("chunk_batches", "vocab_size"):
            continue
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        if least is not None and value < least:
            raise ConfigError(f"{name} must be >= {least}, got {value}")
    if output not in ("torch", "arrays"):
        raise ConfigError(f"output must be 'torch' or 'arrays', got {output!r}")
    if output == "torch":
        try:
            import torch  # noqa: F401 - the consumer needs it anyway; say so now
        except ImportError:
            raise ConfigError(
                "output='torch' (the default) needs torch, which is not installed: "
                "pip install \"neural-datagram[torch]\", or pass output='arrays' for NumPy "
                "(CPU) or Numba device arrays (GPU)") from None


def check_cache_limit(corpus: Any, *, shuffle: bool, window: int | None) -> None:
    """``CacheFullError`` if a remote dataset's ``cache_limit`` cannot hold the shards a chunk
    may read at once (two shuffle windows' worth, ``ndp.loader.order.shards_at_once``)."""
    sizes = np.array([s.size for s in corpus.shards], np.int64)
    for dataset in corpus.remotes:
        limit = dataset.cache.limit
        if limit is None:
            continue
        need = shards_at_once(sizes, shuffle=shuffle, window=window) * int(sizes.max())
        if limit < need:
            raise CacheFullError(
                f"{dataset.url}: cache_limit={limit:,} bytes cannot hold the shards a chunk may "
                f"read at once ({need:,} bytes: "
                f"{'two shuffle windows' if shuffle else 'two shards'} of the largest shard's "
                f"size); raise cache_limit (several ranks sharing the cache need more), or make "
                f"shuffle_window smaller")
