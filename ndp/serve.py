"""Serve: batches handed to the consumer as views into a chunk's outputs (the last stage of the
Loader's pipeline: plan, stage, decode, serve).

The ring: ``n_slots`` slots, each holding one decoded chunk's outputs. The producer takes a free
slot for every chunk it decodes; the consumer holds the chunk it is serving and the one before
it, and gives a slot back when it takes the first batch of the second chunk after that slot's.
Hence the validity contract: **a batch stays valid until the consumer takes a batch of the
second chunk after its own** (so at least until it takes the second batch after it, however
large the chunks).

Wrap once, slice after: a slot's outputs are wrapped for the consumer (torch tensors through
DLPack or ``torch.from_numpy``, or the arrays themselves) once, when they are allocated, and a
batch is a handful of slices of them. The consumer's ``next()`` is a queue get once per chunk
and a few views per batch; no DLPack export, launch, copy or host wait per batch.

Stream order on a GPU, with torch output: when the consumer takes a chunk's first batch, its
current stream is made to wait for the chunk's kernels (``slot.ready``); when it gives the slot
back, an event on its stream marks the end of its work on that chunk, and the producer's stream
waits on it before writing the slot again. Nothing blocks the host. Work must be queued on the
stream that is current when the chunk's first batch is taken (torch's default, unless told
otherwise). With ``output="arrays"`` the ``DeviceArray`` protocol of ``ndp.device`` orders each
consumer instead.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

from ndp.engine import CpuEngine, Slot
from ndp.layout import Batch


class Ring:
    """The slots of decoded chunks and who holds them (see the module docstring)."""

    def __init__(self, engine: CpuEngine, n_slots: int, *, output: str) -> None:
        self.engine, self.output = engine, output
        self.slots = [Slot(i) for i in range(n_slots)]
        self.held: list[Slot] = []  # the consumer's: the chunk before the current one, current
        self._free: queue.Queue = queue.Queue()
        self._wrapped: dict[int, tuple[int, dict]] = {}
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
        consumer holds them all (the producer is that far ahead)."""
        while not stop.is_set():
            try:
                return self._free.get(timeout=0.1)
            except queue.Empty:
                continue
        return None

    def give_back(self, slot: Slot) -> None:
        """A slot the producer took but did not fill with batches."""
        self._free.put(slot)

    # ----------------------------------------------------------------------- consumer's side
    def serve(self, slot: Slot, batches: list[Batch]) -> Iterator[tuple[dict, Batch]]:
        """The chunk's batches as dicts of views, in order. Taking the first makes the
        consumer's stream wait for the chunk and gives back the slot two chunks before it."""
        handle = self._stream_handle()
        self.engine.consumer_wait(slot, handle)
        self.held.append(slot)
        if len(self.held) > 2:
            old = self.held.pop(0)
            self.engine.release(old, handle)
            self._free.put(old)
        if not batches:
            return
        if self.output == "arrays" and self.engine.backend == "cuda":
            for batch in batches:  # DeviceArray views (each orders its own DLPack consumer)
                yield {name: slot.outputs[name].view(self.engine.compute_stream, b, a)
                       for name, (a, b) in batch.rows.items()}, batch
            return
        views = self._views(slot)
        names = list(batches[0].rows)
        if self.output == "torch":  # one split per output for the whole chunk: a C++ call
            parts = {}
            for name in names:
                start, stop = batches[0].rows[name][0], batches[-1].rows[name][1]
                sizes = [b.rows[name][1] - b.rows[name][0] for b in batches]
                parts[name] = views[name][start:stop].split(sizes)
            for i, batch in enumerate(batches):
                yield {name: parts[name][i] for name in names}, batch
            return
        for batch in batches:
            yield {name: views[name][a:b] for name, (a, b) in batch.rows.items()}, batch

    def _views(self, slot: Slot) -> dict:
        """The slot's outputs as the consumer takes them, wrapped once per allocation."""
        have = self._wrapped.get(slot.index)
        if have is not None and have[0] == slot.generation:
            return have[1]
        if self.engine.backend == "cuda":
            arrays = {name: buf.view(self.engine.compute_stream)
                      for name, buf in slot.outputs.items()}
        else:
            arrays = dict(slot.outputs)
        if self.output == "torch":
            from ndp.adapters.torch import tensor

            views = {name: tensor(array) for name, array in arrays.items()}
        else:
            views = arrays
        self._wrapped[slot.index] = (slot.generation, views)
        return views

    def _stream_handle(self) -> int | None:
        """The consumer's current CUDA stream (torch output on a GPU), else ``None``."""
        if self.output != "torch" or not self.engine.has_streams:
            return None
        from ndp.adapters.torch import current_stream_handle

        return current_stream_handle()
