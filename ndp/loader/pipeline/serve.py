"""Serve: batches handed to the consumer as views into a chunk's outputs (the last stage of the
Loader's pipeline: plan, stage, decode, serve).

The ring: ``n_slots`` slots, each holding one decoded chunk's outputs. The producer takes a free
slot for every chunk it decodes; the consumer holds the chunk it is serving and the one before
it, and gives a slot back when it takes the first batch of the second chunk after that slot's.
Hence the reuse rule: **a batch's buffers come round for reuse when the consumer takes a batch
of the second chunk after its own** (so not before it takes the second batch after it,
however large the chunks); a batch still referenced then keeps its buffers (below).

Wrap once per chunk, slice after, on the producer: once a chunk is built, each of the slot's
outputs is wrapped for it (a torch tensor through ``torch.from_numpy`` or DLPack, or the array
itself) and every batch is made as a dict of slices of those (``prepare``), before the chunk is
queued. The consumer's ``next()`` takes a chunk from the queue once per chunk and hands out a
dict per batch: no view, launch, copy or host wait of its own, and no free either: a chunk's
dicts and tensors are let go of by the producer when it takes their slot again (``serve``), so
the training thread does not pay for deallocating them (half its CPU per batch before).

Batches held too long are never overwritten: every array a chunk hands out keeps that chunk's
``Lease`` alive (the wrapped arrays are made over a small object that holds it, so slices,
tensors and DLPack capsules all do), and the ring keeps only a weak reference. When the
producer takes a slot back and its last lease is still alive (``list(loader)``, a loss kept with
its graph, a batch kept past the reuse rule above), the slot's buffers are left to the
consumer and new ones are allocated (counted in ``Counters.held_chunks``, warned about once):
correct batches at the cost of memory, instead of another batch's tokens. A loop that follows
the rule pays nothing for this.

Stream order on a GPU, with torch output: when the consumer takes a chunk's first batch, its current
stream is made to wait for the chunk's kernels (``slot.ready``); when it gives the slot back, an
event on its stream marks the end of its work on that chunk, and the producer's stream waits on it
before it writes the slot's outputs again (not before the next chunk's verdicts). The tensors
themselves are exported with no stream work (DLPack's "no synchronisation": the wait above is
the ordering), so per chunk the consumer's stream gets one wait and one record, and no event is
made. Nothing blocks the host. Work must be queued on the stream that is current when the
chunk's first batch is taken (torch's default, unless told otherwise). With ``output="arrays"``
the ``DeviceArray`` protocol of ``ndp.engine.device`` orders each consumer instead, on the
chunk's own event.
"""

from __future__ import annotations

import queue
import threading
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np

from ndp.engine.cpu import CpuEngine, Slot
from ndp.loader.layouts.layout import Layout


class Lease:
    """A chunk's hold on its slot's buffers, kept alive by every array handed out for it."""

    __slots__ = ("__weakref__",)


class _HostHold:
    """A host buffer's memory, seen through the array interface by an array that then keeps
    this object (so the buffer and the lease) alive."""

    __slots__ = ("__array_interface__", "buffer", "lease")

    def __init__(self, buffer: np.ndarray, lease: Lease) -> None:
        self.__array_interface__ = buffer.__array_interface__
        self.buffer, self.lease = buffer, lease


class _DeviceHold:
    """The same for device memory (CuPy keeps the object whose interface it took)."""

    __slots__ = ("__cuda_array_interface__", "buffer", "lease")

    def __init__(self, buffer: Any, lease: Lease) -> None:
        cai = dict(buffer.__cuda_array_interface__)
        cai.pop("stream", None)  # ordering is ndp.engine.device's; no synchronisation on import
        cai["version"] = 2
        self.__cuda_array_interface__ = cai
        self.buffer, self.lease = buffer, lease


def held(array: Any, lease: Lease) -> Any:
    """``array`` (NumPy or CuPy) as a new array over the same memory that keeps ``lease``."""
    if isinstance(array, np.ndarray):
        return np.asarray(_HostHold(array, lease))
    import cupy

    return cupy.asarray(_DeviceHold(array, lease))


class Ring:
    """The slots of decoded chunks and who holds them (see the module docstring)."""

    def __init__(self, engine: CpuEngine, n_slots: int, *, output: str) -> None:
        self.engine, self.output = engine, output
        self.slots = [Slot(i) for i in range(n_slots)]
        self.held: list[Slot] = []  # the consumer's: the chunk before the current one, current
        self._free: queue.Queue = queue.Queue()
        self._leases: dict[int, weakref.ref] = {}  # slot index -> its last chunk's lease
        # slot index -> its last chunk's batch dicts, let go of by the producer (below)
        self._served: dict[int, list] = {}
        self._warned = False
        self.reset()

    # ----------------------------------------------------------------------- producer's side
    def reset(self) -> None:
        """Every slot the consumer does not hold is free (the producer is not running)."""
        self._free = queue.Queue()
        for slot in self.slots:
            if slot not in self.held:
                self._free.put(slot)

    def acquire(self, stop: threading.Event) -> Slot | None:
        """A free slot for the next chunk; ``None`` once ``stop`` is set. Sleeps while the
        consumer holds them all (the producer is that far ahead). A slot whose last chunk's
        batches are still referenced gets new buffers (see the module docstring)."""
        while not stop.is_set():
            try:
                slot = self._free.get(timeout=0.1)
            except queue.Empty:
                continue
            self._served.pop(slot.index, None)
            lease = self._leases.pop(slot.index, None)
            if lease is not None and lease() is not None:
                self._leave_to_consumer(slot)
            return slot
        return None

    def try_acquire(self) -> Slot | None:
        """A free slot now, or ``None`` (never waits): for a chunk staged ahead
        (``ndp.loader.pipeline.ahead``), which is not worth waiting for."""
        try:
            slot = self._free.get_nowait()
        except queue.Empty:
            return None
        self._served.pop(slot.index, None)
        lease = self._leases.pop(slot.index, None)
        if lease is not None and lease() is not None:
            self._leave_to_consumer(slot)
        return slot

    def give_back(self, slot: Slot) -> None:
        """A slot the producer took but did not fill with batches."""
        self._free.put(slot)

    def _leave_to_consumer(self, slot: Slot) -> None:
        """The consumer still holds batches of ``slot``'s last chunk: those buffers are theirs
        now; the slot allocates new ones when it is next filled."""
        size = sum(int(getattr(b, "nbytes", 0)) for b in slot.outputs.values())
        slot.outputs, slot.flat, slot.out_key, slot.out_caps = {}, {}, (), (0, 0)
        slot.generation += 1
        self.engine.counters.held_chunks += 1
        if not self._warned:
            self._warned = True
            warnings.warn(
                "ndp.Loader: batches were still referenced when their buffers came round for "
                f"reuse, so ndp left those buffers to them and allocated new ones ({size / 1e6:.1f}"
                " MB, and again each time this happens; loader.counters.held_chunks counts it). "
                "Nothing was overwritten. If that memory is not meant to be kept (list(loader), "
                "a loss kept with its graph), keep only the current and previous batch, or "
                ".clone() what you keep.", ResourceWarning, stacklevel=2)

    def prepare(self, slot: Slot, layout: Layout) -> list[dict]:
        """The chunk's batches as dicts of views, in order, made once its outputs are built
        (the producer's work: the consumer's ``next()`` then only hands one out). The slot's
        outputs are wrapped for this chunk over a new ``Lease``."""
        n = layout.n
        if not n:
            return []
        views = self._views(slot)
        names = list(layout.rows)
        if self.output == "torch":  # one split per output for the whole chunk: a C++ call
            columns, cuts = [], {}  # outputs that share row offsets share their split sizes
            for name in names:
                rows = layout.rows[name]
                sizes = cuts.get(id(rows))
                if sizes is None:
                    sizes = cuts[id(rows)] = (int(rows[0]), int(rows[n]),
                                              np.diff(rows).tolist())
                columns.append(views[name][sizes[0]:sizes[1]].split(sizes[2]))
            return [dict(zip(names, row)) for row in zip(*columns)]
        edges = {name: layout.rows[name].tolist() for name in names}
        if self.output == "arrays" and self.engine.backend == "cuda":
            # DeviceArray views (each orders its own DLPack consumer)
            return [{name: views[name].rows(edges[name][i], edges[name][i + 1])
                     for name in names} for i in range(n)]
        return [{name: views[name][edges[name][i]:edges[name][i + 1]] for name in names}
                for i in range(n)]

    # ----------------------------------------------------------------------- consumer's side
    def serve(self, slot: Slot, batches: list[dict]) -> Iterator[dict]:
        """A chunk's batches (``prepare``'s), in order. Taking the chunk makes the consumer's
        stream wait for it and gives back the slot two chunks before it. The ring keeps the
        list until the producer takes the slot again and lets go of it there: a chunk's dicts
        and tensors are freed on the producer's thread, not in the consumer's ``next()``
        (those the user still holds live on, and keep the chunk's lease)."""
        handle = self._stream_handle()
        self._served[slot.index] = batches
        self.engine.consumer_wait(slot, handle)
        self.held.append(slot)
        if len(self.held) > 2:
            old = self.held.pop(0)
            self.engine.release(old, handle)
            self._free.put(old)
        return iter(batches)

    def _views(self, slot: Slot) -> dict:
        """The slot's outputs as the consumer takes them, wrapped for this chunk over a new
        ``Lease`` (the ring keeps a weak reference to it)."""
        lease = Lease()
        self._leases[slot.index] = weakref.ref(lease)
        if self.engine.backend == "cuda":
            # torch's stream already waits for the chunk (``serve``): the tensors are handed
            # over with no stream work; DeviceArrays wait on the chunk's own event
            ordered = self.output == "torch"
            with self.engine.activated():  # the Loader's device, in the consumer's thread
                arrays = {name: buf.leased(self.engine.compute_stream, held(buf.export, lease),
                                           ready=slot.ready, ordered=ordered)
                          for name, buf in slot.outputs.items()}
        else:
            arrays = {name: held(buf, lease) for name, buf in slot.outputs.items()}
        if self.output == "torch":
            from ndp.adapters.torch import tensor

            return {name: tensor(array) for name, array in arrays.items()}
        return arrays

    def _stream_handle(self) -> int | None:
        """The consumer's current CUDA stream (torch output on a GPU), else ``None``."""
        if self.output != "torch" or not self.engine.has_streams:
            return None
        from ndp.adapters.torch import current_stream_handle

        return current_stream_handle()
