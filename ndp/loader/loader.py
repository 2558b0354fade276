"""``ndp.Loader``: whole training batches, decoded ahead of use, on the GPU where there is one.

    loader = ndp.Loader("data/", mode="packed", batch_size=8, seq_len=1024, seed=0)
    for epoch in range(3):
        for batch in loader:            # one epoch of this rank's share
            loss = model(batch["x"], batch["y"])
        state = loader.state_dict()     # small, JSON-serialisable; resume with load_state_dict

Modes, and which shift labels (said here only; ``NDPDataset`` and ``decode_padded`` give
``padded`` rows, ``decode_packed`` gives ``packed`` windows). A causal LM's target at position
``t`` is token ``t + 1``: that shift is made once, by the model or by ndp, as the mode says.

* ``padded`` (SFT): each batch holds the valid packets among the next ``batch_size`` packets of
  this rank's order, one row each, padded to ``seq_len``: ``input_ids``, ``labels``,
  ``attention_mask``. ``labels`` are **not shifted**: ``labels[r, t]`` is ``input_ids[r, t]``,
  or -100 at padding and masked prompt tokens, because Hugging Face causal-LM models shift
  ``labels=`` themselves (shifted here too, each token would learn the one two ahead); a row is
  one example, so their shift loses only its last token's target, and it has none. A corrupt
  packet makes its batch one row shorter (counted in ``stats``) instead of pulling a packet
  forward from the next batch, so every batch depends only on its place in the order: resume
  and rank splits stay exact (a batch of no row is counted in ``stats.empty_batches`` and
  warned about once). A row keeps a longer packet's first ``seq_len`` tokens: the cut is
  counted per epoch from the index and warned, once per epoch, past 1% of its tokens
  (``ndp.loader.layouts.truncation``).
* ``packed`` (pretraining): the valid tokens of this rank's packets, in order, form one stream;
  each batch is ``batch_size`` windows of ``seq_len + 1`` tokens split into ``x`` and ``y``,
  **shifted by one** (llm.c layout: ``y[b, t]`` is the token after ``x[b, t]``, or -100 where
  that token's loss-mask bit is 0), so ``cross_entropy(model(x), y)`` takes them as they are.
  The model could not shift: a window's last target is the next window's first token, which it
  never sees. Windows run across packet and shard boundaries; the tokens left over at the end
  of an epoch (less than one batch) are not used, and counted.
* ``packing`` (SFT, packed rows): short examples laid end to end in full rows, with
  per-document ``position_ids`` and ``cu_seqlens`` (``ndp.loader.layouts.packing``). ``labels`` are
  **not shifted**, as in ``padded``, and -100 at each document's first token too: after the
  model's shift that label is the target of the previous document's last token, and no
  document should learn to predict the next one's start.

Order, rank split, mixing and CRC-Drop are ``ndp.loader.ordering.order``'s: seeded, a new order
every epoch
(documents shuffled across windows of shards of ``shuffle_window`` bytes, 1 GiB by default, or
``"all"``; on a GPU two windows' shards are held on the device at once), disjoint shares across
ranks (``RANK``/``WORLD_SIZE`` or ``rank=``/``world_size=``), and every
rank delivers the same number of batches per epoch, ``len(loader)`` (``ndp.loader.planning.plan``,
counted while the epoch's first batches are delivered and kept for the node's other ranks and
later runs, ``ndp.loader.planning.shared_count``; what that leaves out or repeats is counted in
``stats``). On a GPU the Loader decodes on ``device`` (default: torch's current device, else
``LOCAL_RANK``, else 0), made current in every thread that does its CUDA work
(``ndp.engine.gpu``).
Mixing: ``mix={"code": 0.7, "chat": 0.3}`` with ``data`` a dict of named shard groups
(``mix_by="group"``), or ``mix={"TEXT_CORPUS": 1, "CODE_REPO": 1}`` by packet SRC
(``mix_by="src"``); every source needs a weight (0 leaves it out, counted). ``mix_size``: the
epoch ends when a source runs out (``"shortest"``, default), when every source is used whole,
the smaller ones repeated (``"longest"``), or after that many packets (an int, all ranks
together); repeats and leftovers are counted per source (``ndp.loader.ordering.order.mix``).

A packet a model cannot take is dropped and counted like a corrupt one: one with no tokens
(``EMPTY``: its row would be all padding, a loss of 0/0) and one with a token id at or past the
vocabulary size (``TOKEN_RANGE``): ``vocab_size=``, else the one the dataset's manifest records,
else 2**31 (an int32 id with its top bit set).

A directory is read only as the whole dataset its manifest ``ndp.json`` lists
(``ndp.store.manifest``: a conversion killed half way leaves none, and is refused), and a file that
is no NDP shard (a JSONL) or holds no valid packet is refused (``ndp.store.corpus.no_data``): it
would give 0 batches. ``manifest="ignore"`` reads either as it is, on purpose. A URL
(``s3://bucket/prefix/``, any fsspec URL; ``storage_options``) is read through a local cache
(``cache_dir``, ``cache_limit``) shared by the ranks of a node, the shards fetched ahead of need
(``ndp.store.remote``).

Indexes are matched to their shards by size (``verify="size"``), not by reading every shard to
compare its crc32 (``verify="full"``): time to the first batch does not grow with the data set,
and every packet's CRC is still checked as it is decoded.

The state (``state_dict``) is the epoch, a (packet, token) position in this rank's order and the
run's step, plus the settings it is only valid for (``ndp.loader.states.resume``). ``batch_size``,
``seq_len`` and ``mix`` may change with the step (``ndp.Schedule``, ``ndp.loader.planning.shapes``,
``ndp.loader.ordering.mix_schedule``); ``batch_tokens`` cuts padded and packing batches by a token
budget
instead of ``batch_size`` rows.

The pipeline: **plan** (``ndp.loader.planning.plan``), **stage** (``ndp.loader.pipeline.stage``, on
a GPU
``ndp.loader.pipeline.device_shards``: whole shards copied in bulk), **decode**
(``ndp.loader.pipeline.chunks``: one
verdict kernel, one small copy back and one host wait, one build kernel per chunk of batches) and
**serve** (``ndp.loader.pipeline.serve``: batches are views into the chunk's outputs). Any
``chunk_batches`` gives the same batches, as the CPU and CUDA backends do, bit for bit.

Prefetch: a producer thread decodes up to ``prefetch`` chunks ahead; its exception is raised by
``next()``; ``close()``, the ``with`` block's end, leaving the loop or dropping the Loader stops
it. Batches are views of a ring of ``max(1, prefetch) + 3`` chunks' buffers, reused from the
second chunk after a batch's own on; a batch still referenced then keeps its buffers (new ones
are allocated, warned once: ``ndp.loader.pipeline.serve``), so a held batch never shows another's
tokens.
What the decoder did is counted in ``loader.counters`` (``ndp.engine.counters``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ndp.engine.backend import resolve_backend
from ndp.loader.states.checkpoint import CheckpointMethods
from ndp.loader.pipeline.chunks import ChunkDecoder, batches_per_chunk
from ndp.loader.explain import ExplainViews
from ndp.loader.pipeline.running import LIVE, ProducerThread, refuse_if_forked
from ndp.store.corpus import Corpus
from ndp.engine.cpu import CpuEngine
from ndp.kernels.verdict import NO_VOCAB
from ndp.errors import LoaderUsageError, past_aliases
from ndp.loader.planning import skips
from ndp.loader.ordering import units
from ndp.loader.options import (  # noqa: F401 - MODES
    MODES, check_cache_limit, check_options, check_world, data_name, no_batch)
from ndp.loader.ordering.order import WINDOW_BYTES, check_window, rank_and_world
from ndp.loader.planning.plan import Plan
from ndp.loader.pipeline.producer import EPOCH_END, Producer
from ndp.progress import progress_bar
from ndp.loader.planning.schedule import Schedule
from ndp.loader.pipeline.serve import Ring
from ndp.loader.planning.shapes import from_setting, setting, shape_schedule
from ndp.loader.planning.steps import StepViews
from ndp.loader.stats import LoaderStats
from ndp.loader.pipeline.taken import Taken, TakenViews
from ndp.loader.telemetry import Waits, telemetry
from ndp.loader.layouts.truncation import CutReport

class Loader(CheckpointMethods, TakenViews, StepViews, ExplainViews):
    """Batches from NDP shards; see the module docstring for modes, order and validity."""

    def __init__(
        self,
        data: str | os.PathLike | Sequence[str | os.PathLike] | Corpus,
        *,
        batch_size: int | Schedule | None = None,
        seq_len: int | Schedule,
        mode: str = "padded",
        pad_token_id: int | None = None,
        shuffle: bool = True,
        shuffle_window: int | str = WINDOW_BYTES,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        crc_drop_rate: float = 0.0,
        backend: str = "auto",
        resident: bool = False,
        device_budget: int | None = None,
        prefetch: int = 1,
        chunk_batches: int | None = None,
        output: str = "torch",
        progress: bool = False,
        mix: dict[str | int, float] | None = None,
        mix_by: str = "group",
        mix_size: str | int = "shortest",
        verify: str = "size",
        manifest: str = "check",
        vocab_size: int | None = None,
        storage_options: dict | None = None,
        cache_dir: str | os.PathLike | None = None,
        cache_limit: int | None = None,
        device: int | None = None,
        batch_tokens: int | Schedule | None = None,
        max_steps: int | None = None,
        skip: Sequence[tuple[int, int]] | None = None,
        skip_packets: Sequence[int] | None = None,
        documents: bool = False,
        align: str | None = None,
    ) -> None:
        check_options(mode=mode, batch_size=batch_size, seq_len=seq_len,
                      batch_tokens=batch_tokens, prefetch=prefetch,
                      seed=seed, pad_token_id=pad_token_id, chunk_batches=chunk_batches,
                      vocab_size=vocab_size, output=output, crc_drop_rate=crc_drop_rate,
                      shuffle=shuffle, resident=resident, progress=progress, verify=verify,
                      manifest=manifest, device=device, device_budget=device_budget,
                      cache_limit=cache_limit, mix=mix, max_steps=max_steps,
                      documents=documents, align=align)
        # Python's own types from here on (a NumPy int or bool passes the checks); a batch
        # shape of one phase is its int (``ndp.loader.planning.shapes``), as states record it
        batch_size, seq_len, batch_tokens = (
            None if value is None else setting(shape_schedule(name, value)) for name, value in
            (("batch_size", batch_size), ("seq_len", seq_len), ("batch_tokens", batch_tokens)))
        prefetch, seed = map(int, (prefetch, seed))
        crc_drop_rate, shuffle = float(crc_drop_rate), bool(shuffle)
        chunk_batches = None if chunk_batches is None else int(chunk_batches)
        self.backend = resolve_backend(backend)
        self.corpus = data if isinstance(data, Corpus) else Corpus(
            data, verify=verify, manifest=manifest, storage_options=storage_options,
            cache_dir=cache_dir, cache_limit=cache_limit)
        check_cache_limit(self.corpus, shuffle=shuffle, window=check_window(shuffle_window))
        #: token ids must be below this: ``vocab_size``, else the dataset's manifest's, else
        #: 2**31 (an id must fit int32); a packet with one past it is dropped (TOKEN_RANGE)
        self.vocab_size = vocab_size or self.corpus.vocab_size or NO_VOCAB
        #: ``pad_token_id``, else the manifest's tokenizer's padding id, else 0
        pad_token_id = int(self.corpus.pad_token_id or 0 if pad_token_id is None else pad_token_id)
        self.mode = mode
        #: ``batch_size``, ``seq_len`` and ``batch_tokens`` as given: an int, a schedule's
        #: record (``setting``), or None (``batch_tokens`` in a state only when given)
        self._shape_settings = {"batch_size": batch_size, "seq_len": seq_len,
                                **({"batch_tokens": batch_tokens} if batch_tokens else {})}
        self.pad_token_id, self.shuffle, self.seed = pad_token_id, shuffle, seed
        self.rank, self.world_size = rank_and_world(rank, world_size)
        check_world(self.corpus.n_packets, self.world_size, self._where())
        if mode == "packed":  # data split before pieces were marked: said, not silent
            units.warn_unmarked(self.corpus, self._where(), stacklevel=past_aliases(3))
        self.crc_drop_rate, self.prefetch, self.output = crc_drop_rate, prefetch, output
        self.progress = progress
        self.plan = Plan(self.corpus, mode=mode, batch_size=from_setting(batch_size),
                         batch_tokens=from_setting(batch_tokens),
                         seq_len=from_setting(seq_len),
                         shuffle=shuffle, seed=seed, rank=self.rank, world_size=self.world_size,
                         crc_drop_rate=crc_drop_rate, mix=mix, mix_by=mix_by,
                         mix_size=mix_size, shuffle_window=shuffle_window)
        self.plan.max_steps = None if max_steps is None else int(max_steps)
        self.plan.skips = skips.check_skip(skip)  # run steps left out
        # (``ndp.loader.planning.skips``)
        self.plan.skip_packets = skips.check_packets(skip_packets, self.corpus.n_packets)
        self.plan.documents, self.plan.align = bool(documents), align
        if self.backend == "cuda":
            from ndp.engine.cuda import CudaEngine
            from ndp.loader.pipeline.device_shards import DeviceShards

            self.engine: CpuEngine = CudaEngine(device=device)
            with self.engine.activated():
                stager = DeviceShards(self.engine, self.corpus, budget=device_budget,
                                      resident=resident, shuffle=shuffle,
                                      window=check_window(shuffle_window))
        else:
            from ndp.loader.pipeline.stage import HostStager

            self.engine = CpuEngine()
            stager = HostStager(self.corpus, resident=resident)
        #: the GPU it decodes on (``None``: the CPU backend): ``device``, else torch's
        #: current one, else ``LOCAL_RANK``, else 0 (``ndp.engine.gpu.choose_device``)
        self.device = self.engine.device
        #: what the decoder did: chunks, batches, launches, copies, host waits, DLPack exports
        self.counters = self.engine.counters
        # slots: the queue's max(1, prefetch) chunks, the producer's one, the consumer's two
        self._ring = Ring(self.engine, max(1, prefetch) + 3, output=output)
        decoder = ChunkDecoder(self.engine, stager, self.plan, pad_token_id=pad_token_id,
                               per_chunk=batches_per_chunk(self.backend, chunk_batches),
                               vocab=self.vocab_size)
        #: batches per chunk (of the first batch shape, with a schedule)
        self.chunk_batches = decoder.chunk_batches
        self._producer = Producer(self.plan, decoder, self._ring)
        stats = LoaderStats(corrupt_regions=len(self.corpus.corruption),
                            corrupt_bytes=sum(c.length for _, c in self.corpus.corruption))
        # : the state and stats of what the consumer took, kept lazily
        # (``ndp.loader.pipeline.taken``)
        self._taken = Taken({"epoch": 0, "pos": 0, "tok": 0, "batch": 0}, stats)
        self._cut = CutReport(self.plan, stats)  # padded rows cut: counted, warned
        self._waits = Waits()  # each wait of next() for a chunk (``ndp.loader.telemetry``)
        self._running = ProducerThread(self._producer, self._ring, self.plan, prefetch)
        self._lock = threading.Lock()
        self._active: object | None = None  # the loop iterating, one at a time
        self._pid = os.getpid()
        #: the process this Loader's running threads were left in by a fork (``_forked``)
        self._forked_from: int | None = None

    def __len__(self) -> int:
        """Batches this rank delivers in the whole current epoch (the one the next loop
        continues or starts: once a loop has run to its end, the next epoch's, which can
        differ; ``loader.epoch`` says which), exact before the epoch is read: every rank
        delivers as many,
        whatever is corrupt (``ndp.loader.planning.plan``). It stays the whole epoch after a resume
        mid-epoch
        (LR schedules count on it): ``remaining`` is what the next loop yields.

        With ``mix=`` it may differ from epoch to epoch. An int ``mix_size`` fixes it in
        ``padded`` mode only: it fixes an epoch's packets, ``batch_size`` to a padded batch;
        ``packed`` and ``packing`` batches follow the tokens of each epoch's packets. With
        ``max_steps`` an epoch counts the batches before the run's end, with ``skip`` those
        it does not skip (``ndp.loader.planning.skips``)."""
        return self.plan.kept_batches(self.epoch)

    # ----------------------------------------------------------------------------- iterate
    def __iter__(self) -> Iterator[dict]:
        """The rest of the current epoch; the next ``iter()`` starts the next epoch.

        The producer thread outlives the epoch (it is already decoding the next one); leaving
        the loop early, ``close()``, ``load_state_dict`` or dropping the loader stops it."""
        refuse_if_forked(self)
        self._refuse_past_end()
        self._cut.start(self.epoch)  # before the epoch's first batch and its producer, once
        token = object()
        with self._lock:
            if self._active is not None:
                raise LoaderUsageError(
                    "this Loader is already being iterated by another loop (in this thread or "
                    "another); iterate it from one loop at a time, or give each consumer its "
                    "own Loader")
            self._active = token
            if not self._running.running:
                self._start_producer()
        # the bar's total once the epoch is counted (``ndp.loader.planning.count``): not waited for
        sized = self.progress and self.plan.counted(self.epoch)
        start, done = self.plan.start_step(self.epoch), self._state["batch"]
        bar = progress_bar(total=len(self) if sized else None,  # the batches a loop yields
                           initial=done - skips.skipped(self.plan.skips, start, start + done),
                           desc=f"ndp epoch {self.epoch}",
                           enabled=self.progress, unit="batch")
        finished = False
        taken, limited = self._taken, self.plan.max_steps is not None
        try:
            with bar:
                while True:
                    if self._active is not token:
                        raise LoaderUsageError(
                            "this loop's Loader was closed (close() or load_state_dict()); "
                            "start a new loop to go on from where it stopped")
                    t = time.perf_counter()
                    item = self._get()
                    waited = time.perf_counter() - t
                    taken.settle().wait_seconds += waited
                    self._waits.add(waited)
                    if item[0] is EPOCH_END:
                        self._cut.end()
                        ended = self.epoch
                        _, self._state, counted = item
                        taken.settle().add(counted)
                        finished = True
                        if self.plan.epoch_batches(ended) == 0:
                            b, t = self.plan.shapes_of(ended).at(0)
                            raise no_batch(
                                where=self._where(), epoch=ended, rank=self.rank,
                                world_size=self.world_size, mode=self.mode,
                                batch_size=b, seq_len=t,
                                n_packets=self.corpus.n_packets,
                                share=self.plan.share(ended).length)
                        return
                    _, epoch, chunk = item
                    left = skips.mask(self.plan.skips, self.plan.start_step(epoch)
                                      + chunk.layout.first, chunk.layout.n)
                    taken.begin(epoch, chunk.layout, left)
                    self._cut.poll()
                    for batch in self._ring.serve(chunk.slot, chunk.take()):
                        if limited and self.plan.ended(self.step):  # the run's end
                            return
                        taken.n += 1  # the state and stats follow from it when read
                        if left is not None and left[taken.n - 1]:
                            continue  # a skipped step (``ndp.loader.planning.skips``): counted
                        if self.progress:
                            if not sized and self.plan.counted(epoch):
                                sized, bar.total = True, len(self)
                            bar.update(1)
                        yield batch
        finally:
            if self._active is token:
                self._active = None
                if not finished:  # left early (break, exception, garbage collection)
                    self._stop_producer()

    def telemetry(self) -> dict:
        """This rank's figures for a dashboard: ``next()``'s waits (p50, p99, max, a
        histogram), tokens/s, drops by reason, batches left, ndp's threads' CPU seconds; the
        same numbers as ``stats`` (``ndp.loader.telemetry``; exported by
        ``ndp.serve_metrics`` and ``ndp.telemetry_scalars``)."""
        return telemetry(self)

    def _where(self) -> str:
        return data_name(self.corpus)

    def _get(self) -> Any:
        return self._running.get()

    def close(self) -> None:
        """Stop the producer thread and close the shard files (idempotent); a loop still
        running over this loader raises ``LoaderUsageError`` at its next batch. A new loop
        starts the thread again (and reopens files as it reads them)."""
        self._active = None
        self._stop_producer()
        if self._explainer is not None:  # its plan's count, if one runs
            self._explainer.close()
        self.corpus.close()

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
        self._running.start(self._state)
        LIVE.add(self)

    def _stop_producer(self) -> None:
        self._running.stop()
