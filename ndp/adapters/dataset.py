"""``NDPDataset``: a map-style dataset of padded SFT rows, for ``torch.utils.data.DataLoader``.

    ds = NDPDataset("data/", seq_len=512, pad_token_id=0, crc_drop_rate=0.05)
    dl = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True, num_workers=4)
    for epoch in range(3):
        ds.set_epoch(epoch)             # a new CRC-Drop draw (set it before creating iterators)
        for batch in dl:                # dicts of int64 tensors (batch_size, seq_len)
            ...

Item ``i`` is the ``i``-th kept packet in global order (shards in name order): every packet is
validated once at construction, the corrupt ones, and those a model cannot take (no tokens, or a
token id past the vocabulary size, as the ``Loader`` drops them), are left out (counted by
``DropReason`` in ``stats``), then CRC-Drop removes a seeded fraction on purpose. Items are NumPy arrays (this
module does not import torch); DataLoader's default collate turns them into tensors. The
dataset pickles without its open shards, which each worker reopens on first use; an item is one
pread(2) of its packet (``ndp.store.files``).

Items are decoded by a serial kernel built from the same helpers as ``decode_padded`` (so the
rows are the same, bit for bit): a single packet gains nothing from ndp's thread pool.

``set_epoch`` writes the epoch into shared memory, so workers of
``DataLoader(persistent_workers=True)``, started before it, draw the new epoch's CRC-Drop too.

Ranks. Every rank opens the whole dataset; a sampler gives each its share of the indices:
``torch.utils.data.DistributedSampler(ds, num_replicas=world_size, rank=rank, seed=s)`` takes
every ``world_size``-th index of a permutation seeded by ``s`` and its ``set_epoch``, the same
on every rank, so the shares are disjoint. With ``drop_last=False`` (its default) it repeats up
to ``world_size - 1`` indices so that every rank gets ``ceil(len(ds) / world_size)`` items;
``drop_last=True`` leaves as many out instead. It reads ``len(ds)`` when it is made: with
``crc_drop_rate > 0``, ``len(ds)`` changes with the epoch, so make the sampler (and its
DataLoader) after ``ds.set_epoch(epoch)``, each epoch.

Resume mid-epoch: torchdata's ``StatefulDataLoader`` (torchdata is no dependency of ndp; 0.9
or newer has ``StatefulDistributedSampler``) resumes an NDPDataset as it is. Item ``i`` is a
function of the shards, ``seed``, ``crc_drop_rate``, ``seq_len``, ``pad_token_id`` and
the epoch, not of which items were read before, so the loader's state is its sampler's place: its
``RandomSampler`` (``shuffle=True``) and ``StatefulDistributedSampler`` save it, any other
sampler is fast-forwarded past the batches already yielded. The epoch is the caller's: save it
beside ``dl.state_dict()`` and call ``ds.set_epoch(epoch)`` before making the sampler and
``dl.load_state_dict(state)``. NDPDataset has no ``state_dict`` of its own on purpose:
StatefulDataLoader restores a dataset's state as it starts iterating (inside each worker when
it has workers), after the sampler was made from ``len(ds)``: too late for the epoch.

    ds = NDPDataset("data/", seq_len=2048, crc_drop_rate=0.05, seed=0)
    for epoch in range(start_epoch, n_epochs):  # start_epoch, saved: from the checkpoint
        ds.set_epoch(epoch)
        sampler = StatefulDistributedSampler(ds, num_replicas=world_size, rank=rank, seed=0)
        sampler.set_epoch(epoch)
        dl = StatefulDataLoader(ds, batch_size=8, sampler=sampler, num_workers=4)
        if saved is not None:  # resuming inside this epoch
            dl.load_state_dict(saved)
            saved = None
        for batch in dl:
            ...
            checkpoint = {"epoch": epoch, "data": dl.state_dict()}  # with the model's
"""

from __future__ import annotations

import multiprocessing
import warnings
from collections.abc import Sequence
from typing import Any

import numba
import numpy as np

from ndp.store.corpus import Corpus, PathLike
from ndp.errors import IndexMismatchError, ItemIndexError, renamed
from ndp.wire.format import IGNORE_INDEX, TYP_MASKED_TABLE, TYP_SKIP_TABLE, TYP_WIDTH_TABLE, DropReason
from ndp.kernels.build import in_loss, token_at, token_layout
from ndp.kernels.crc16 import CRC16_TABLES, packet_status
from ndp.kernels.verdict import NO_VOCAB, status_of, verdicts_cpu
from ndp.checks import INT32_END, choice, integer
from ndp.loader.options import check_memory
from ndp.loader.ordering.order import check_drop_rate, drop_mask


# Not cached on disk: Numba's cache checks only the file a function is defined in, and this one
# calls kernels from ndp.kernels, so a cached copy could outlive a change to them. It is
# compiled once at construction instead (fork-started workers inherit it).
@numba.njit(nogil=True)
def _padded_row(shard, off, pad_id, ids, labels, attn, tables, w_t, m_t, s_t):  # pragma: no cover
    """Validate the packet at ``off`` and, if it is OK, fill one padded row (as
    ``decode_padded`` does, serially); return its DropReason code."""
    status = packet_status(shard, off, tables, w_t, m_t, s_t)
    if status != 0:
        return status
    n, tok, mask, width = token_layout(shard, off, w_t, m_t)
    m = min(n, ids.shape[0])
    for t in range(ids.shape[0]):
        value = token_at(shard, tok, t, width) if t < m else pad_id
        ids[t] = value
        labels[t] = value if t < m and in_loss(shard, mask, t) else IGNORE_INDEX
        attn[t] = 1 if t < m else 0
    return status


class NDPDataset:
    """Padded rows ``{"input_ids", "labels", "attention_mask"}`` (int64, ``(seq_len,)``).

    ``path`` is a shard, a directory of shards or a list of either. Rows longer than ``seq_len``
    (``max_seq_length``: its deprecated name) are truncated, shorter ones padded with
    ``pad_token_id``; labels are the Loader's ``padded`` ones, not shifted
    (``ndp.loader.loader``, "Modes"): -100 at padding and at masked (prompt) tokens.
    ``crc_drop_rate`` drops that fraction of packets on purpose, a new draw per ``set_epoch``,
    deterministic per ``seed``. ``on_stale`` is ``Corpus``'s: "rebuild" rescans a shard whose
    index does not match it, "error" refuses it. A directory must be the whole dataset its
    manifest ``ndp.json`` lists unless ``manifest`` is "ignore" (``ndp.store.manifest``).
    ``vocab_size`` (else the manifest's, else 2**31): token ids must be below it. A URL is read
    through the shard cache (``ndp.store.remote``), every shard fetched when the dataset is made:
    ``cache_limit`` must hold the whole dataset. A file that is not an NDP shard, or holds no
    valid packet, is refused (``ndp.store.corpus.no_data``) unless ``manifest`` is "ignore".
    Ranks (a ``DistributedSampler``) and resuming mid-epoch (torchdata's
    ``StatefulDataLoader``, the epoch set first): see this module's docstring.
    """

    @renamed(max_seq_length="seq_len")
    def __init__(
        self,
        path: PathLike | Sequence[PathLike],
        seq_len: int = 512,
        pad_token_id: int | None = None,
        crc_drop_rate: float = 0.0,
        *,
        seed: int = 0,
        epoch: int = 0,
        on_stale: str = "rebuild",
        manifest: str = "check",
        vocab_size: int | None = None,
        storage_options: dict | None = None,
        cache_dir: PathLike | None = None,
        cache_limit: int | None = None,
    ) -> None:
        integer("seq_len", seq_len, least=1)
        integer("pad_token_id", pad_token_id, least=-INT32_END, most=INT32_END - 1, none=True)
        integer("seed", seed, least=0)
        integer("epoch", epoch, least=0)
        integer("vocab_size", vocab_size, least=1, most=INT32_END, none=True)
        integer("cache_limit", cache_limit, least=1, none=True)
        choice("on_stale", on_stale, ("rebuild", "error"))
        choice("manifest", manifest, ("check", "ignore"))
        check_drop_rate(crc_drop_rate)
        # an item is three int64 rows of seq_len; a batch of them is the DataLoader's
        check_memory(f"NDPDataset(seq_len={seq_len:,}): an item (input_ids, labels, "
                     f"attention_mask, int64)", 3 * 8 * int(seq_len),
                     "make seq_len smaller (a row need not be longer than the longest packet)")
        self.seq_len = int(seq_len)
        self.crc_drop_rate = float(crc_drop_rate)
        self.seed = int(seed)
        self.on_stale = on_stale
        self._manifest = manifest  # "ignore" reads files that hold no packet: so must a worker
        self._corpus: Corpus | None = Corpus(
            path, on_stale=on_stale, verify="full", manifest=manifest,
            storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit)
        corpus = self._corpus
        #: ``pad_token_id``, else the manifest's tokenizer's padding id, else 0
        self.pad_token_id = int(corpus.pad_token_id or 0 if pad_token_id is None
                                else pad_token_id)
        self._paths = list(corpus.paths)
        self._n_packets = corpus.n_packets
        vocab = vocab_size or corpus.vocab_size or NO_VOCAB
        status = np.empty(corpus.n_packets, np.uint8)
        for s, shard in enumerate(corpus.shards):
            lo, hi = corpus.base[s], corpus.base[s + 1]
            if hi > lo:
                verdicts = np.empty(hi - lo, np.int64)
                verdicts_cpu(shard.read(0, shard.size), corpus.offsets[lo:hi],
                             np.zeros(0, np.int64), verdicts, vocab)
                status[lo:hi] = status_of(verdicts)
        self._valid = status == DropReason.OK
        counts = np.bincount(status, minlength=len(DropReason))
        self._corrupt = {DropReason(c).name: int(n) for c, n in enumerate(counts)
                         if c != DropReason.OK and n}
        self._regions = (len(corpus.corruption), sum(c.length for _, c in corpus.corruption))
        self._shared_epoch = multiprocessing.RawValue("q", int(epoch))
        self._drawn_epoch: int | None = None
        self._follow_epoch()
        if len(self):
            self[0]  # compile the item kernel here, before any DataLoader worker is forked

    def set_epoch(self, epoch: int) -> None:
        """Redraw CRC-Drop for ``epoch`` (the kept packets, and so ``len``, change with it).

        The epoch lives in shared memory, so DataLoader workers started before the call
        (``persistent_workers=True``) follow it too: a worker redraws on its first item of the
        new epoch. Call it between epochs, not while a DataLoader iterates."""
        self._shared_epoch.value = int(epoch)
        self._follow_epoch()

    @property
    def max_seq_length(self) -> int:
        """Deprecated: ``seq_len``."""
        warnings.warn("NDPDataset: `max_seq_length` is deprecated, read `seq_len` (the same "
                      "value)", DeprecationWarning, stacklevel=2)
        return self.seq_len

    @property
    def epoch(self) -> int:
        return int(self._shared_epoch.value)

    def _follow_epoch(self) -> None:
        """Redraw CRC-Drop if the shared epoch moved since the last draw (a no-op otherwise)."""
        epoch = self.epoch
        if epoch == self._drawn_epoch:
            return
        drop = drop_mask(self._n_packets, seed=self.seed, epoch=epoch, rate=self.crc_drop_rate)
        self._dropped = int(np.count_nonzero(self._valid & drop))
        self.kept = np.flatnonzero(self._valid & ~drop).astype(np.int64)
        self._drawn_epoch = epoch

    @property
    def corpus(self) -> Corpus:
        """The opened shards (reopened lazily after unpickling, e.g. in a DataLoader worker)."""
        if self._corpus is None:
            corpus = Corpus(self._paths, on_stale=self.on_stale, verify="size",  # checked at build
                            manifest=self._manifest)
            if corpus.n_packets != self._n_packets:
                raise IndexMismatchError(
                    f"shards now hold {corpus.n_packets} packets, {self._n_packets} when the "
                    f"dataset was built: they changed since; build the dataset again")
            self._corpus = corpus
        return self._corpus

    @property
    def stats(self) -> dict[str, Any]:
        """Packet counts: ``packets`` (in the corpus), ``valid``, ``corrupt`` (DropReason name ->
        count), ``dropped_on_purpose`` (CRC-Drop, this epoch), ``kept``, and the damage a
        rescan of a stale index skipped (``corrupt_regions``, ``corrupt_bytes``)."""
        self._follow_epoch()
        return {
            "packets": self._n_packets,
            "valid": int(np.count_nonzero(self._valid)),
            "corrupt": dict(self._corrupt),
            "dropped_on_purpose": self._dropped,
            "kept": int(self.kept.shape[0]),
            "corrupt_regions": self._regions[0],
            "corrupt_bytes": self._regions[1],
        }

    def __len__(self) -> int:
        self._follow_epoch()
        return int(self.kept.shape[0])

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        n = len(self)
        if not -n <= i < n:
            raise self._out_of_range(i, n)
        g = int(self.kept[i])
        corpus = self.corpus
        s = int(corpus.shard_of(np.array([g]))[0])
        row = {k: np.empty(self.seq_len, np.int64)
               for k in ("input_ids", "labels", "attention_mask")}
        frame = corpus.shards[s].read(int(corpus.offsets[g]), int(corpus.frame_bytes[g]))
        status = _padded_row(frame, 0, self.pad_token_id,
                             row["input_ids"], row["labels"], row["attention_mask"],
                             CRC16_TABLES, TYP_WIDTH_TABLE, TYP_MASKED_TABLE, TYP_SKIP_TABLE)
        if status != DropReason.OK:
            raise IndexMismatchError(f"{corpus.paths[s]}: packet {g} no longer validates "
                                     f"({DropReason(int(status)).name}); the shard changed")
        return row

    def _out_of_range(self, i: int, n: int) -> ItemIndexError:
        """The error for index ``i`` of an epoch of ``n`` items; one another epoch may hold
        (below the valid packets' count, with CRC-Drop) was drawn for the length before the last
        ``set_epoch``: the message says so and what to do."""
        problem = f"index {i} out of range for the {n} items of epoch {self.epoch}"
        valid = int(np.count_nonzero(self._valid))
        if self.crc_drop_rate > 0 and -valid <= i < valid:
            return ItemIndexError(
                f"{problem}: with CRC-Drop (crc_drop_rate={self.crc_drop_rate}) the length "
                f"changes with the epoch, and this index was drawn for another epoch's, by a "
                f"sampler or DataLoader (persistent workers included) made before "
                f"set_epoch({self.epoch}); make the sampler and its DataLoader after "
                f"ds.set_epoch(epoch), each epoch (ndp.adapters.dataset, \"Ranks\")")
        return ItemIndexError(problem)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_corpus"] = None  # reopened by each worker
        if not _spawning():  # outside a worker's start shared memory cannot travel: a number
            state["_shared_epoch"] = self.epoch
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if isinstance(state["_shared_epoch"], int):
            state["_shared_epoch"] = multiprocessing.RawValue("q", state["_shared_epoch"])
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return (f"NDPDataset({len(self._paths)} shards, {len(self)} of {self._n_packets} "
                f"packets, seq_len={self.seq_len})")


def _spawning() -> bool:
    """Whether this pickling starts a worker process (shared memory may travel then only)."""
    from multiprocessing.context import get_spawning_popen

    return get_spawning_popen() is not None


#: the original tool's name
QubGPUDataset = NDPDataset
