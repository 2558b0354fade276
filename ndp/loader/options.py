"""The ``Loader``'s options, checked before anything is read: each error names the option, the
value given and what it may be (``ndp.errors.ConfigError``); and whether a remote dataset's
``cache_limit`` holds the shards the Loader's windows read at once."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ndp.checks import INT32_END, choice, flag, integer
from ndp.engine.cpu import OUTPUTS, grow
from ndp.errors import CacheFullError, ConfigError, DataError
from ndp.loader.layouts.align import ALIGNS
from ndp.loader.ordering.order import check_drop_rate, shards_at_once
from ndp.loader.planning.schedule import Schedule, check_run_end
from ndp.loader.planning.shapes import Shapes

MODES = ("padded", "packed", "packing")


def check_options(*, mode: str, batch_size: Any, seq_len: Any, batch_tokens: Any = None,
                  prefetch: int, seed: int,
                  pad_token_id: int | None, chunk_batches: int | None, vocab_size: int | None,
                  output: str, crc_drop_rate: float = 0.0, shuffle: bool = True,
                  resident: bool = False, progress: bool = False, verify: str = "size",
                  manifest: str = "check", device: int | None = None,
                  device_budget: int | None = None, cache_limit: int | None = None,
                  mix: Any = None, max_steps: int | None = None, documents: bool = False,
                  align: str | None = None) -> None:
    """``ConfigError`` for any option of a type or value the Loader cannot work with (one
    check per option, ``ndp.checks``: a string for a number, a float for an integer, NaN, a
    bool for a number, a name not among the allowed ones); torch imported now if the batches
    are to be torch tensors, so a missing torch is said at once."""
    choice("mode", mode, MODES)
    shapes = Shapes.of(batch_size, seq_len, batch_tokens)  # ints, or schedules of them
    if batch_tokens is not None and mode == "packed":
        raise ConfigError("batch_tokens cuts padded and packing batches by a token budget; "
                          "a packed batch is batch_size x seq_len tokens already: give "
                          "batch_size (a Schedule of it to change it with the step)")
    prefetch = integer("prefetch", prefetch, least=0)
    integer("seed", seed, least=0)
    integer("pad_token_id", pad_token_id, least=-INT32_END, most=INT32_END - 1, none=True)
    chunk_batches = integer("chunk_batches", chunk_batches, least=1, none=True)
    integer("vocab_size", vocab_size, least=1, most=INT32_END, none=True)
    check_drop_rate(crc_drop_rate)
    for name, value in (("shuffle", shuffle), ("resident", resident), ("progress", progress)):
        flag(name, value)
    choice("verify", verify, ("size", "full"))
    choice("manifest", manifest, ("check", "ignore"))
    integer("device", device, least=0, none=True)
    integer("device_budget", device_budget, least=1, none=True)
    integer("cache_limit", cache_limit, least=1, none=True)
    max_steps = integer("max_steps", max_steps, least=1, none=True)
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len),
                        ("batch_tokens", batch_tokens), ("mix", mix)):
        check_run_end(name, value, max_steps)
    if mix is not None and not isinstance(mix, (Mapping, Schedule)):
        raise ConfigError(f"mix must be a dict of {{source: weight}}, a Schedule of them, or "
                          f"None, got {type(mix).__name__}")
    if flag("documents", documents) and mode != "packed":
        raise ConfigError(f"`documents=True` marks document boundaries in packed windows; "
                          f"mode={mode!r} rows already hold one example each (packing: "
                          f"see its position_ids and cu_seqlens)")
    if choice("align", align, ALIGNS) is not None and mode != "packed":
        raise ConfigError(f"align={align!r} starts packed windows at documents; in "
                          f"mode={mode!r} every row already starts at an example")
    if align is not None and isinstance(mix, Schedule):
        raise ConfigError(f"align={align!r} with a mix Schedule is not supported: a scheduled "
                          f"mix draws each document with the weights of the step it lands in, "
                          f"counted for unaligned windows; give a fixed mix, or align=None")
    for b, t in zip(shapes.sizes, shapes.lens):
        check_batch_memory(mode=mode, batch_size=b, seq_len=t, prefetch=prefetch,
                           chunk_batches=chunk_batches)
    choice("output", output, ("torch", "arrays"))
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
    may read at once (two shuffle windows' worth, ``ndp.loader.ordering.order.shards_at_once``)."""
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


def memory_bytes() -> int | None:
    """This machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_memory(what: str, need: int, fix: str) -> None:
    """``ConfigError`` if ``need`` bytes (what ``what`` allocates at least) exceed this machine's
    memory: such an option would be a ``MemoryError`` at the first batch, or an epoch of no
    batch, rather than a batch."""
    have = memory_bytes()
    if have is not None and need > have:
        raise ConfigError(f"{what} needs at least {need:,} bytes, more than this machine's "
                          f"{have:,} bytes of memory; {fix}")


def check_batch_memory(*, mode: str, batch_size: int, seq_len: int, prefetch: int,
                       chunk_batches: int | None) -> None:
    """``ConfigError`` if the least the Loader's ring of output buffers allocates does not fit
    in this machine's memory (``check_memory``). The ring (``ndp.loader.loader``) holds
    ``max(1, prefetch) + 3`` chunks of ``chunk_batches`` batches (at least one) of
    ``batch_size x seq_len`` int64s per output, and one output of a chunk is allocated for
    ``grow(rows)`` rows (64 at least, ``ndp.engine.cpu``): either is more than any machine
    holds long before ``seq_len`` reaches 2**40. A ``seq_len`` longer than every packet, or
    than an epoch's tokens, is allowed below that (rows padded, or no batch)."""
    outputs = [name for name, _ in OUTPUTS[mode] if name != "cu_seqlens"]  # int64 (rows, cols)
    rows = (chunk_batches or 1) * batch_size
    row_bytes = 8 * seq_len
    need = max((max(1, prefetch) + 3) * rows * row_bytes * len(outputs),
               grow(rows) * row_bytes)
    check_memory(
        f"Loader(mode={mode!r}, batch_size={batch_size:,}, seq_len={seq_len:,}): its ring of "
        f"int64 outputs ({', '.join(outputs)})", need,
        "make seq_len smaller (a row need not be longer than the longest packet, padded), or "
        "batch_size, prefetch or chunk_batches")


def data_name(corpus: Any) -> str:
    """The data a corpus reads, for a message: a remote dataset's URL, the shards' directory,
    or the one shard."""
    if corpus.remotes:
        return corpus.remotes[0].url
    paths = corpus.paths
    return str(paths[0]) if len(paths) == 1 else f"{paths[0].parent} ({len(paths)} shards)"


def check_world(n_packets: int, world_size: int, where: str) -> None:
    """``DataError`` if ``world_size`` ranks leave a rank no packet (every epoch would make no
    batch on every rank: a loop over epochs would never take a step). Data of no packet at
    all is the corpus' to refuse (``manifest='ignore'`` reads it, warned: its epochs end in
    ``no_batch``)."""
    if 0 < n_packets < world_size:
        raise DataError(
            f"{where}: {n_packets:,} packets for world_size={world_size}: every rank's share "
            f"of an epoch holds whole packets, and ranks take as many (the rest is cut), so "
            f"each rank would get none and no epoch would make a batch. Use at most "
            f"{n_packets:,} ranks, or add data")


def no_batch(*, where: str, epoch: int, rank: int, world_size: int, mode: str,
             batch_size: int, seq_len: int, n_packets: int, share: int) -> DataError:
    """The ``DataError`` for an epoch that made no batch (a training loop over epochs would
    spin on it forever without a step): what the data and the settings give, and what to
    change. ``share``: the packets of the rank's share (after CRC-Drop, mixing and the cut
    that keeps ranks equal)."""
    if mode == "padded":
        need = f"a padded batch takes {batch_size:,} packets (fewer make a last, short batch)"
    elif mode == "packed":
        need = (f"a packed batch takes batch_size x seq_len + 1 = {batch_size * seq_len + 1:,} "
                f"tokens of a rank's share")
    else:
        need = (f"a packing batch takes whole packets into {batch_size:,} rows of "
                f"{seq_len:,} tokens")
    ranks = f" of each of {world_size} ranks" if world_size > 1 else ""
    return DataError(
        f"{where}: epoch {epoch} makes no batch on rank {rank}: the share{ranks} holds "
        f"{share:,} of the {n_packets:,} packets (after any CRC-Drop, mixing, and the cut "
        f"that gives every rank as many), too few for one: {need}. A loop over epochs would "
        f"never take a step: lower `batch_size` or `seq_len`, use fewer ranks, or add data "
        f"(or a larger `mix_size`)")
