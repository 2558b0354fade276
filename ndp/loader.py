"""``ndp.Loader``: whole training batches, decoded ahead of use, on the GPU where there is one.

    loader = ndp.Loader("data/", mode="packed", batch_size=8, seq_len=1024, seed=0)
    for epoch in range(3):
        for batch in loader:            # one epoch of this rank's share
            loss = model(batch["x"], batch["y"])
        state = loader.state_dict()     # small, JSON-serialisable; resume with load_state_dict

Modes:

* ``padded`` (SFT): each batch holds the valid packets among the next ``batch_size`` packets of
  this rank's order, one row each, padded to ``seq_len``: ``input_ids``, ``labels`` (-100 at
  padding and masked prompt tokens), ``attention_mask``. A corrupt packet makes its batch one row
  shorter (counted in ``stats``) instead of pulling a packet forward from the next batch, so every
  batch depends only on its place in the order: resume and rank splits stay exact.
* ``packed`` (pretraining): the valid tokens of this rank's packets, in order, form one stream;
  each batch is ``batch_size`` windows of ``seq_len + 1`` tokens split into ``x`` and ``y``
  (llm.c layout; ``y`` is -100 where a token's loss-mask bit is 0). Windows run across packet and
  shard boundaries; the tokens left over at the end of an epoch (less than one batch) are not
  used, and counted.

* ``packing`` (SFT, packed rows): short examples laid end to end in full rows, with
  per-document ``position_ids`` and ``cu_seqlens`` (``ndp.packing``).

Order, rank split, mixing and CRC-Drop are ``ndp.order``'s: seeded, a new order every epoch, every
packet once per epoch across ranks (``RANK``/``WORLD_SIZE`` or ``rank=``/``world_size=``).
Mixing: ``mix={"code": 0.7, "chat": 0.3}`` with ``data`` a dict of named shard groups
(``mix_by="group"``), or ``mix={"TEXT_CORPUS": 1, "CODE_REPO": 1}`` by packet SRC
(``mix_by="src"``); every source needs a weight (0 leaves it out, counted).

Indexes are matched to their shards by size (``verify="size"``), not by reading every shard to
compare its crc32 (``verify="full"``): time to the first batch does not grow with the data set,
and every packet's CRC is still checked as it is decoded.

The state (``state_dict``) is the epoch and a (packet, token) position in this rank's order,
plus the settings it is only valid for; ``load_state_dict`` refuses a state made with others.

Prefetch: a producer thread stages and decodes up to ``prefetch`` batches ahead into a bounded
queue. An exception in it is raised by the consumer's ``next()`` (with the producer's traceback
chained); ``close()``, leaving the ``with`` block, breaking out of the loop or dropping the last
reference stops the thread. Batches alias the decoder's ring of ``max(1, prefetch) + 3`` buffer sets: a
batch stays valid while it or the batch after it is the newest one taken; once the consumer takes
the second batch after it, its buffers may be refilled (``.clone()`` what must live longer). On
a GPU the refill is ordered after the work queued on the default stream (where ``torch`` puts it
unless told otherwise) before that point.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ndp.corpus import Corpus
from ndp.decode import StreamExhausted
from ndp.decoder import Decoder
from ndp.errors import ConfigError
from ndp.format import DropReason
from ndp.kernels.stage import gather_packets, staged_size
from ndp.order import drop_mask, epoch_order, mix, rank_and_world, rank_share
from ndp.progress import progress_bar

MODES = ("padded", "packed", "packing")
STATE_VERSION = 1


@dataclass
class LoaderStats:
    """What the loader has delivered so far (consumer side)."""

    batches: int = 0
    packets: int = 0  # packets of this rank's order taken into batches
    valid: int = 0
    corrupt: dict[str, int] = field(default_factory=dict)  # DropReason name -> count
    dropped_on_purpose: int = 0  # CRC-Drop
    tokens: int = 0  # tokens delivered (x tokens in packed mode)
    truncated_tokens: int = 0  # padded rows cut at seq_len
    unused_tokens: int = 0  # packed: stream tokens left at epoch ends
    wait_seconds: float = 0.0  # consumer time blocked on the producer
    sources: dict[str, int] = field(default_factory=dict)  # mixing: packets per source
    mix_unused: dict[str, int] = field(default_factory=dict)  # mixing: left when an epoch ended
    # damage found when a stale index was rebuilt (those bytes are no packets in the index)
    corrupt_regions: int = 0
    corrupt_bytes: int = 0

    def add(self, other: dict) -> None:
        for key in ("packets", "valid", "dropped_on_purpose", "tokens", "truncated_tokens",
                    "unused_tokens"):
            setattr(self, key, getattr(self, key) + other.get(key, 0))
        for key in ("corrupt", "sources", "mix_unused"):
            mine = getattr(self, key)
            for name, n in other.get(key, {}).items():
                mine[name] = mine.get(name, 0) + n

    def as_dict(self) -> dict:
        return {
            "batches": self.batches, "packets": self.packets, "valid": self.valid,
            "corrupt": dict(self.corrupt), "dropped_on_purpose": self.dropped_on_purpose,
            "tokens": self.tokens, "truncated_tokens": self.truncated_tokens,
            "unused_tokens": self.unused_tokens, "wait_seconds": round(self.wait_seconds, 6),
            "corrupt_regions": self.corrupt_regions, "corrupt_bytes": self.corrupt_bytes,
            "sources": dict(self.sources), "mix_unused": dict(self.mix_unused),
        }


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_EPOCH_END = object()  # the producer's last item of an epoch


class Loader:
    """Batches from NDP shards; see the module docstring for modes, order and validity."""

    def __init__(
        self,
        data: str | os.PathLike | Sequence[str | os.PathLike] | Corpus,
        *,
        batch_size: int,
        seq_len: int,
        mode: str = "padded",
        pad_token_id: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        crc_drop_rate: float = 0.0,
        backend: str = "auto",
        resident: bool = False,
        device_budget: int | None = None,
        prefetch: int = 2,
        output: str = "torch",
        progress: bool = False,
        mix: dict[str | int, float] | None = None,
        mix_by: str = "group",
        verify: str = "size",
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {mode!r}")
        if batch_size < 1 or seq_len < 1:
            raise ConfigError(f"batch_size and seq_len must be >= 1, got {batch_size}, {seq_len}")
        if prefetch < 0:
            raise ConfigError(f"prefetch must be >= 0, got {prefetch}")
        if output not in ("torch", "arrays"):
            raise ConfigError(f"output must be 'torch' or 'arrays', got {output!r}")
        drop_mask(0, seed=seed, epoch=0, rate=crc_drop_rate)  # validates the rate
        self.corpus = data if isinstance(data, Corpus) else Corpus(data, verify=verify)
        self.mode, self.batch_size, self.seq_len = mode, batch_size, seq_len
        self.pad_token_id, self.shuffle, self.seed = pad_token_id, shuffle, seed
        self.rank, self.world_size = rank_and_world(rank, world_size)
        self.crc_drop_rate, self.prefetch, self.output = crc_drop_rate, prefetch, output
        self.progress = progress
        # the queue holds max(1, prefetch) batches, the producer one more, the consumer two
        ring = max(1, prefetch) + 3
        self.decoder = Decoder(backend=backend, ring=ring, device_budget=device_budget)
        self.backend = self.decoder.backend
        self._producer = _Producer(
            corpus=self.corpus, decoder=self.decoder, mode=mode, batch_size=batch_size,
            seq_len=seq_len, pad_token_id=pad_token_id, shuffle=shuffle, seed=seed,
            rank=self.rank, world_size=self.world_size, crc_drop_rate=crc_drop_rate,
            output=output, mix=mix, mix_by=mix_by, resident=resident,
        )
        self._state = {"epoch": 0, "pos": 0, "tok": 0}
        self.stats = LoaderStats(
            corrupt_regions=len(self.corpus.corruption),
            corrupt_bytes=sum(c.length for _, c in self.corpus.corruption),
        )
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._queue: queue.Queue | None = None

    # ----------------------------------------------------------------------- state / resume
    def state_dict(self) -> dict:
        """Where the consumer is: the next batch after ``load_state_dict`` of this is the one
        the consumer would have received next. Small and JSON-serialisable."""
        return {"version": STATE_VERSION, "mode": self.mode, "seed": self.seed,
                "shuffle": self.shuffle, "rank": self.rank, "world_size": self.world_size,
                "batch_size": self.batch_size, "seq_len": self.seq_len,
                "crc_drop_rate": self.crc_drop_rate, "n_packets": self.corpus.n_packets,
                "mix": self._producer.mix_spec, **self._state}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (from ``state_dict``); ``ConfigError`` if it was made for
        another configuration or corpus, since its positions would mean other packets."""
        if state.get("version") != STATE_VERSION:
            raise ConfigError(f"loader state version {state.get('version')} is not "
                              f"{STATE_VERSION}")
        mine = self.state_dict()
        for key in ("mode", "seed", "shuffle", "rank", "world_size", "batch_size", "seq_len",
                    "crc_drop_rate", "n_packets", "mix"):
            if state.get(key) != mine[key]:
                raise ConfigError(f"loader state has {key}={state.get(key)!r}, this loader "
                                  f"{mine[key]!r}; resume with the same settings and shards")
        self._stop_producer()
        self._state = {"epoch": int(state["epoch"]), "pos": int(state["pos"]),
                       "tok": int(state["tok"])}

    @property
    def epoch(self) -> int:
        return self._state["epoch"]

    # ----------------------------------------------------------------------------- iterate
    def __iter__(self) -> Iterator[dict]:
        """The rest of the current epoch; the next ``iter()`` starts the next epoch.

        The producer thread outlives the epoch (it is already decoding the next one); leaving
        the loop early, ``close()``, ``load_state_dict`` or dropping the loader stops it."""
        if self._thread is None:
            self._start_producer()
        bar = progress_bar(total=None, desc=f"ndp epoch {self.epoch}", enabled=self.progress,
                           unit="batch")
        finished = False
        try:
            with bar:
                while True:
                    t = time.perf_counter()
                    batch, state, counted = self._get()
                    self.stats.wait_seconds += time.perf_counter() - t
                    self._state = state
                    self.stats.add(counted)
                    if batch is _EPOCH_END:
                        finished = True
                        return
                    self.stats.batches += 1
                    bar.update(1)
                    yield batch
        finally:
            if not finished:  # left early (break, exception, garbage collection)
                self._stop_producer()

    def _get(self) -> Any:
        while True:
            try:
                item = self._queue.get(timeout=0.1)
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self._thread = None
                    raise RuntimeError("ndp loader: the producer thread ended without a result")
                continue
            if isinstance(item, _Failure):
                self._stop_producer()
                raise item.exc
            return item

    def close(self) -> None:
        """Stop the producer thread (idempotent)."""
        self._stop_producer()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._stop_producer()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def _start_producer(self) -> None:
        self._stop_producer()
        self._stop.clear()
        self._queue = queue.Queue(maxsize=max(1, self.prefetch))
        start = dict(self._state)
        self._thread = threading.Thread(target=self._producer.run,
                                        args=(start, self._queue, self._stop),
                                        name="ndp-loader", daemon=True)
        self._thread.start()

    def _stop_producer(self) -> None:
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        while thread.is_alive():
            try:  # unblock a producer waiting on a full queue
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            thread.join(timeout=0.05)
        self._thread = None


class _Producer:
    """Everything that makes batches, apart from the ``Loader`` the consumer holds: the
    producer thread references only this, so dropping the last reference to a ``Loader``
    collects it (and its ``__del__`` stops the thread)."""

    def __init__(self, *, corpus: Corpus, decoder: Any, mode: str, batch_size: int,
                 seq_len: int, pad_token_id: int, shuffle: bool, seed: int, rank: int,
                 world_size: int, crc_drop_rate: float, output: str, mix: dict | None,
                 mix_by: str, resident: bool) -> None:
        self.corpus, self.decoder, self.mode = corpus, decoder, mode
        self.batch_size, self.seq_len, self.pad_token_id = batch_size, seq_len, pad_token_id
        self.shuffle, self.seed, self.rank, self.world_size = shuffle, seed, rank, world_size
        self.crc_drop_rate, self.output = crc_drop_rate, output
        self._setup_mix(mix, mix_by)
        self._share_cache: tuple | None = None
        self._buffer = np.empty(0, np.uint8)
        self._source = self._make_resident() if resident else None

    def run(self, state: dict, out: queue.Queue, stop: threading.Event) -> None:
        """Produce batches from ``state`` on, epoch after epoch, into ``out`` until ``stop``;
        an exception is handed to the consumer in place of a batch."""
        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    out.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            while not stop.is_set():
                for item in self._batches(state):
                    if not put(item):
                        return
                    if item[0] is _EPOCH_END:
                        state = item[1]
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            put(_Failure(exc))

    def _share(self, epoch: int) -> tuple[np.ndarray, int, dict]:
        """This rank's packets of ``epoch`` after CRC-Drop and mixing, how many CRC-Drop
        removed, and per source how many packets mixing left unused."""
        if self._share_cache is not None and self._share_cache[0] == epoch:
            return self._share_cache[1:]
        within = "phase" if self.mode == "packed" else "permute"
        order = epoch_order(self.corpus.base, seed=self.seed, epoch=epoch, shuffle=self.shuffle,
                            within=within)
        share = rank_share(order, self.rank, self.world_size)
        dropped = drop_mask(self.corpus.n_packets, seed=self.seed, epoch=epoch,
                            rate=self.crc_drop_rate)
        kept = share[~dropped[share]]
        unused_by_source: dict[str, int] = {}
        if self._mix_keys is not None:
            key = self._source_key(kept)
            parts = [kept[key == k] for k in range(len(self._mix_names))]
            kept, unused = mix(parts, self._mix_weights, seed=self.seed, epoch=epoch,
                               rank=self.rank)
            unused_by_source = {name: int(n) for name, n in zip(self._mix_names, unused) if n}
        self._share_cache = (epoch, kept, int(dropped[share].sum()), unused_by_source)
        return self._share_cache[1:]

    def _setup_mix(self, weights: dict | None, mix_by: str) -> None:
        """Sources and their weights; every source present in the corpus must have a weight
        (0 leaves it out on purpose), so no packet is left out silently."""
        self._mix_keys = self._mix_weights = None
        self._mix_names: list[str] = []
        self.mix_spec = None
        self._mix_by = mix_by
        if mix_by not in ("group", "src"):
            raise ConfigError(f"mix_by must be 'group' or 'src', got {mix_by!r}")
        if weights is None:
            return
        corpus = self.corpus
        if mix_by == "group":
            present = {name: g for g, name in enumerate(corpus.groups)}
        else:
            from ndp.format import Src

            present = {}
            for v in np.unique(corpus.src).tolist():
                try:
                    present[Src(v).name] = v
                except ValueError:
                    present[str(v)] = v
        named = {}
        for key, w in weights.items():
            name = key.name if hasattr(key, "name") else str(key)
            if isinstance(key, int) and mix_by == "src" and not hasattr(key, "name"):
                name = next((n for n, v in present.items() if v == key), str(key))
            if name not in present:
                raise ConfigError(f"mix names {key!r}, which is not a {mix_by} of this corpus "
                                  f"(it has {sorted(present)})")
            named[name] = float(w)
        missing = sorted(set(present) - set(named))
        if missing:
            raise ConfigError(f"mix gives no weight to {missing}; give each {mix_by} a weight "
                              f"(0 to leave it out on purpose)")
        self._mix_names = sorted(named)
        self._mix_weights = np.array([named[n] for n in self._mix_names])
        values = np.array([present[n] for n in self._mix_names], np.int64)
        lookup = np.full(256 if mix_by == "src" else len(corpus.groups), -1, np.int64)
        lookup[values] = np.arange(values.shape[0])
        self._mix_keys = lookup
        self.mix_spec = [[n, named[n]] for n in self._mix_names]
        mix([np.zeros(0, np.int64)] * len(values), self._mix_weights, seed=0, epoch=0, rank=0)

    def _source_key(self, packets: np.ndarray) -> np.ndarray:
        """Mixing source number of each packet."""
        raw = self.corpus.group[packets] if self._mix_by == "group" else self.corpus.src[packets]
        return self._mix_keys[raw]

    def _batches(self, state: dict) -> Iterator[tuple[Any, dict, dict]]:
        """(batch, state after it, what it counted) for the rest of ``state``'s epoch, then
        (_EPOCH_END, the next epoch's start, what the epoch's end counted)."""
        epoch, pos, tok = state["epoch"], state["pos"], state["tok"]
        share, n_dropped, mix_unused = self._share(epoch)
        pending = {"dropped_on_purpose": n_dropped} if pos == 0 and tok == 0 else {}
        if self.mode == "padded":
            gen = self._padded(share, pos)
        elif self.mode == "packed":
            gen = self._packed(share, pos, tok)
        else:
            gen = self._packing(share, pos)
        tail: dict = {}
        for batch, where, counted in gen:
            self._by_source(share, counted)
            if batch is _EPOCH_END:
                tail = counted
                break
            counted.update(pending)
            pending = {}
            yield self._convert(batch), {"epoch": epoch, **where}, counted
        tail.update(pending)
        if mix_unused:
            tail["mix_unused"] = mix_unused
        yield _EPOCH_END, {"epoch": epoch + 1, "pos": 0, "tok": 0}, tail

    def _by_source(self, share: np.ndarray, counted: dict) -> None:
        """Turn the batch's ``_range`` of newly counted share positions into packets per
        source (mixing only)."""
        a, b = counted.pop("_range", (0, 0))
        if self._mix_keys is not None and b > a:
            n = np.bincount(self._source_key(share[a:b]), minlength=len(self._mix_names))
            counted["sources"] = {name: int(k) for name, k in zip(self._mix_names, n) if k}

    def _padded(self, share: np.ndarray, pos: int):
        B = self.batch_size
        while pos < share.shape[0]:
            packets = share[pos: pos + B]
            source, offsets = self._stage(packets)
            batch = self.decoder.decode_padded(source, offsets, max_seq_length=self.seq_len,
                                               pad_token_id=self.pad_token_id)
            pos += packets.shape[0]
            s = batch.stats
            yield ({"input_ids": batch.input_ids, "labels": batch.labels,
                    "attention_mask": batch.attention_mask},
                   {"pos": pos, "tok": 0},
                   {"packets": s.packets, "valid": s.valid, "corrupt": s.dropped,
                    "tokens": s.tokens, "truncated_tokens": s.truncated_tokens,
                    "_range": (pos - packets.shape[0], pos)})
        yield _EPOCH_END, {}, {}

    def _packing(self, share: np.ndarray, pos: int):
        """Rows of whole examples laid end to end (``ndp.packing``). The candidates are the
        packets that fill the batch by their index lengths; after decoding, the valid ones are
        placed, and the batch ends at the first that does not fit."""
        from ndp import packing
        from ndp.device import array_module, producer_stream, wrap_like

        B, L = self.batch_size, self.seq_len
        n = share.shape[0]
        while pos < n:
            cap = 8 * B
            while True:  # enough candidates to fill B rows by their index lengths
                claimed = self.corpus.tokens[share[pos: pos + cap]]
                _, _, fits = packing.plan(claimed, rows=B, row_len=L)
                if fits < claimed.shape[0] or pos + cap >= n:
                    break
                cap *= 2
            q = pos + max(fits, 1)
            source, offsets = self._stage(share[pos:q])
            batch = self.decoder.decode_padded(source, offsets, max_seq_length=L,
                                               pad_token_id=self.pad_token_id)
            lengths = np.minimum(_host(batch.lengths), L)
            rows_of = _host(batch.rows)  # candidate index of each valid example
            where_row, where_col, placed = packing.plan(lengths, rows=B, row_len=L)
            lengths = lengths[:placed]
            idx = packing.layout(lengths, where_row, where_col, rows=B, row_len=L)
            taken = int(rows_of[placed]) if placed < rows_of.shape[0] else q - pos
            status = _host(batch.status)[:taken]
            xp = array_module(batch.input_ids)
            if xp is np:
                ids, labels = _host(batch.input_ids), _host(batch.labels)
                out = packing.gather(np, ids, labels, idx, pad_id=self.pad_token_id, rows=B,
                                     row_len=L)
                if not isinstance(batch.input_ids, np.ndarray):  # the simulator's "device"
                    out = {k: wrap_like(batch.input_ids, v) for k, v in out.items()}
            else:
                with producer_stream(batch.input_ids):
                    out = packing.gather(xp, batch.input_ids.array, batch.labels.array, idx,
                                         pad_id=self.pad_token_id, rows=B, row_len=L)
                out = {k: wrap_like(batch.input_ids, v) for k, v in out.items()}
            counted = _count(status)
            counted["_range"] = (pos, pos + taken)
            pos += taken
            counted["tokens"] = int(lengths.sum())
            counted["truncated_tokens"] = int(np.maximum(_host(batch.lengths)[:placed] - L,
                                                         0).sum())
            yield out, {"pos": pos, "tok": 0}, counted
        yield _EPOCH_END, {}, {}

    def _packed(self, share: np.ndarray, pos: int, tok: int):
        """Windows over the stream of ``share[pos:]``'s valid tokens, from token ``tok`` of it.

        Each batch decodes the packets that (by their index lengths) hold the next B*T + 1
        tokens, more if corrupt ones held fewer; afterwards ``pos`` moves past the packets the
        next window no longer needs, so the state stays a small (packet, token) pair."""
        B, T = self.batch_size, self.seq_len
        need = B * T + 1
        tokens = self.corpus.tokens
        n = share.shape[0]
        counted_upto = pos  # packets before this were counted by an earlier batch
        while True:
            # the packets from pos whose index lengths cover the window (a bounded look-ahead:
            # a cumulative sum over the rest of the epoch would cost O(epoch) per batch)
            ahead = 64
            while True:
                cum = np.cumsum(tokens[share[pos: pos + ahead]])
                if (cum.shape[0] and cum[-1] >= tok + need) or pos + ahead >= n:
                    break
                ahead *= 4
            q = pos + int(np.searchsorted(cum, tok + need)) + 1
            while True:
                q = min(q, n)
                source, offsets = self._stage(share[pos:q])
                try:
                    batch = self.decoder.decode_packed(source, offsets, batch_size=B,
                                                       seq_len=T, start=tok)
                    break
                except StreamExhausted as exc:
                    if q < n:
                        q += max(8, (q - pos) // 4)  # corrupt packets held fewer tokens
                        continue
                    tail = _count(exc.status[counted_upto - pos:])
                    tail["unused_tokens"] = max(exc.stream_tokens - tok, 0)
                    tail["_range"] = (counted_upto, n)
                    yield _EPOCH_END, {}, tail
                    return
            status = _host(batch.status)
            counted = _count(status[counted_upto - pos:])
            counted["_range"] = (counted_upto, q)
            counted_upto = q
            counted["tokens"] = B * T
            tok += B * T
            # rebase: skip the packets that end before the next window's first token
            run = np.cumsum(np.where(status == DropReason.OK, tokens[share[pos:q]], 0))
            skip = int(np.searchsorted(run, tok, side="right"))
            if skip:
                tok -= int(run[skip - 1])
                pos += skip
            yield {"x": batch.x, "y": batch.y}, {"pos": pos, "tok": tok}, counted

    def _convert(self, batch: dict) -> dict:
        if self.output == "arrays":
            return batch
        from ndp.adapters.torch import tensor

        return {name: tensor(array) for name, array in batch.items()}

    # ----------------------------------------------------------------------------- staging
    def _stage(self, packets: np.ndarray) -> tuple[Any, np.ndarray]:
        """(source, offsets) for the decoder: the resident corpus with global byte offsets, or
        the packets gathered from their shards into one host buffer."""
        if self._source is not None:
            return self._source, self._resident_offsets[packets]
        corpus = self.corpus
        shard_ids = corpus.shard_of(packets)
        offsets = corpus.offsets[packets]
        if packets.shape[0] == 0 or (shard_ids == shard_ids[0]).all():  # one shard: no gather
            return corpus.shards[int(shard_ids[0]) if packets.shape[0] else 0].data, offsets
        sizes = np.empty(packets.shape[0], np.int64)
        bounds = np.flatnonzero(np.diff(shard_ids)) + 1
        starts = np.concatenate([[0], bounds])
        stops = np.concatenate([bounds, [packets.shape[0]]])
        total = 0
        for a, b in zip(starts, stops):
            total += staged_size(corpus.shards[shard_ids[a]].data, offsets[a:b], sizes[a:b])
        if self._buffer.shape[0] < total:
            self._buffer = np.empty(max(total, 2 * self._buffer.shape[0]), np.uint8)
        new_offsets = np.empty_like(offsets)
        limits = np.empty_like(offsets)
        at = 0
        for a, b in zip(starts, stops):
            part = int(sizes[a:b].sum())
            gather_packets(corpus.shards[shard_ids[a]].data, offsets[a:b], sizes[a:b],
                           self._buffer[at: at + part], new_offsets[a:b], limits[a:b])
            new_offsets[a:b][new_offsets[a:b] >= 0] += at
            at += part
        return self._buffer[:total], new_offsets

    def _make_resident(self) -> Any:
        corpus = self.corpus
        sizes = [int(s.data.shape[0]) for s in corpus.shards]
        byte_base = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        whole = np.empty(int(byte_base[-1]), np.uint8)
        for s, shard in enumerate(corpus.shards):
            whole[byte_base[s]: byte_base[s + 1]] = shard.data
        self._resident_offsets = corpus.offsets + byte_base[corpus.shard_of(
            np.arange(corpus.n_packets))]
        return self.decoder.resident(whole, name=f"corpus of {len(corpus.shards)} shards")



def _host(array: Any) -> np.ndarray:
    return array if isinstance(array, np.ndarray) else array.copy_to_host()


def _count(status: np.ndarray) -> dict:
    """Counts for the packets of ``status`` (those not counted by an earlier batch)."""
    codes = np.bincount(status, minlength=len(DropReason))
    return {"packets": int(status.shape[0]), "valid": int(codes[DropReason.OK]),
            "corrupt": {DropReason(c).name: int(k) for c, k in enumerate(codes)
                        if c != DropReason.OK and k}}
