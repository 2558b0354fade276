"""``CudaEngine``: the decode primitives of ``ndp.engine.cpu`` on a GPU (or Numba's simulator).

Kernels run on one compute stream, shard bytes arrive on a copy stream
(``ndp.loader.pipeline.device_shards``); both are non-blocking streams, so neither waits for the
training
job's work on the legacy default stream. Per decode call the host waits once: for the verdicts (one
small copy back), which it needs to lay the batches out. Everything else it only queues.

Every launch, copy and wait goes through a method here that counts it (``ndp.engine.counters``).

Ordering of a slot's reuse (no host synchronisation): ``finish`` records ``slot.ready`` after the
chunk's kernels; the consumer makes its stream wait on it before it reads the chunk, and records
``slot.released`` on its stream when it is done with it (``ndp.loader.pipeline.serve``); ``claim``
makes
the compute stream wait on ``slot.released`` just before the build writes the slot's outputs
again, not before the chunk's verdicts (the plan, verdicts and pinned scratch are ndp's own), so
the one host wait of a chunk never waits for the consumer's work. Buffers handed out as
``DeviceArray``s are fenced there too, as ``ndp.engine.device`` describes. A slot's two events
are made once and reused for every chunk.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ndp.engine.backend import simulated
from ndp.engine.counters import Counters
from ndp.engine.device import Buffer, configure, external, new_event, new_stream, pinned
from ndp.engine.gpu import activate, choose_device, select
from ndp.engine.cpu import NO_WINS, CpuEngine, Slot, Staged
from ndp.wire.format import TYP_MASKED_TABLE, TYP_SKIP_TABLE, TYP_WIDTH_TABLE
from ndp.kernels.crc16 import CRC16_TABLES


def _kernels():
    from ndp.kernels import build_cuda, verdict_cuda

    return verdict_cuda, build_cuda


class CudaEngine(CpuEngine):
    """Decode primitives on the device; same methods and values as ``CpuEngine``."""

    backend = "cuda"
    #: Numba's simulator runs every kernel synchronously: nothing to order
    has_streams = not simulated()

    def __init__(self, counters: Counters | None = None, *, device: int | None = None) -> None:
        super().__init__(counters)
        from numba import cuda

        #: the GPU this engine works on (``ndp.engine.gpu.choose_device``)
        self.device = choose_device(device)
        with self.activated():  # streams, tables and events on that device
            self.copy_stream = new_stream()
            self.compute_stream = new_stream()
            # on the compute stream, so every kernel is ordered after them (a copy on the
            # legacy stream is not: ndp's streams do not wait for it)
            self.tables = {name: cuda.to_device(table, stream=self.compute_stream)
                           for name, table in (
                               ("crc", CRC16_TABLES), ("width", TYP_WIDTH_TABLE),
                               ("masked", TYP_MASKED_TABLE), ("skip", TYP_SKIP_TABLE))}
            self.no_limits = cuda.device_array(0, dtype=np.int64)
            # grids of at most 8 blocks per multiprocessor (1 block under the simulator)
            self._max_grid = 1 if simulated() else (
                8 * cuda.get_current_device().MULTIPROCESSOR_COUNT)
        self._launchers: dict[tuple, Any] = {}

    def activated(self) -> Any:
        """A context in which this engine's device is current (``ndp.engine.gpu.activate``)."""
        return activate(self.device)

    def new_event(self) -> Any:
        """An event on this engine's device, counted (``Counters.events_created``)."""
        return new_event(self.counters)

    def enter_thread(self) -> None:
        """Make this engine's device current for good in a thread ndp started."""
        select(self.device)

    # ------------------------------------------------------------------------------- buffers
    def _host(self, n: int, dtype: Any) -> np.ndarray:
        return pinned(n, dtype)

    def _device(self, n: int, dtype: Any, like: np.ndarray) -> Any:
        from numba import cuda

        return cuda.device_array(n, dtype=dtype)

    def _output(self, shape: tuple[int, ...], dtype: Any) -> Buffer:
        return Buffer(shape, dtype, counters=self.counters)

    def _shaped(self, flat: Buffer, rows: int, cols: int) -> Buffer:
        return flat.shaped(rows, cols)


    # ---------------------------------------------------------------------- counted transfers
    def h2d(self, dst: Any, src: np.ndarray, stream: Any = None) -> None:
        """Queue a copy of pinned ``src`` into device array ``dst``."""
        if src.shape[0] == 0:
            return
        dst.copy_to_device(src, stream=self.compute_stream if stream is None else stream)
        self.counters.h2d_copies += 1
        self.counters.h2d_bytes += int(src.nbytes)

    def d2h(self, dst: np.ndarray, src: Any) -> None:
        """Queue a copy of device array ``src`` into pinned ``dst`` on the compute stream."""
        src.copy_to_host(dst, stream=self.compute_stream)
        self.counters.d2h_copies += 1
        self.counters.d2h_bytes += int(dst.nbytes)

    def wait(self, event: Any) -> None:
        """Block the host until ``event`` has happened."""
        event.synchronize()
        self.counters.host_waits += 1

    def upload(self, slot: Slot, name: str, values: np.ndarray) -> Any:
        dev, host = self.scratch(slot, name, values.shape[0], values.dtype)
        n = values.shape[0]
        host[:n] = values
        self.h2d(dev[:n], host[:n])
        return dev[:n]

    def launch(self, kernel: Any, items: int, per_block: int, block: int) -> Any:
        """``kernel`` configured for ``items`` units of work (``per_block`` per block) on the
        compute stream: enough blocks to fill the device a few times over, never more than the
        work (grid-stride loops cover the rest). Launchers are cached: a steady loop builds
        none after the first chunks."""
        grid = max(1, min(math.ceil(items / per_block), self._max_grid))
        key = (kernel, grid, block)
        launcher = self._launchers.get(key)
        if launcher is None:
            launcher = self._launchers[key] = configure(kernel, grid, block, self.compute_stream)
        self.counters.launches += 1
        return launcher

    # ------------------------------------------------------------------------------- kernels
    def submit_verdicts(self, staged: Staged, slot: Slot, vocab: int) -> None:
        """Queue the verdict kernel (ids must be below ``vocab``) and the copy of the verdicts
        back (no wait)."""
        verdict_cuda, _ = _kernels()
        n = staged.n
        dev, host = self.scratch(slot, "verdicts", n, np.int64)
        if n:
            t = self.tables
            args = (staged.data, staged.offsets, staged.limits, dev[:n], t["crc"], t["width"],
                    t["masked"], t["skip"], np.int64(vocab))
            lanes = self.verdict_lanes(staged)
            if lanes == 1:
                self.launch(verdict_cuda.verdicts_cuda, n, verdict_cuda.VERDICT_BLOCK,
                            verdict_cuda.VERDICT_BLOCK)(*args)
            else:  # long packets: several threads each, blocks of LANES_BLOCK threads (one
                # packet's under the simulator, whose threads are slow)
                block = lanes if simulated() else verdict_cuda.LANES_BLOCK
                self.launch(verdict_cuda.verdicts_lanes_cuda, n * lanes, block, block)(
                    *args, np.int64(lanes))
            self.d2h(host[:n], dev[:n])
            slot.judged.record(self.compute_stream)

    def verdict_lanes(self, staged: Staged) -> int:
        """Threads per packet for the verdicts of ``staged``: by its packets' mean size where it
        is known (``verdict_cuda.lanes_for``), else one; one under the simulator, whose blocks
        are one thread (``VERDICT_BLOCK``)."""
        verdict_cuda, _ = _kernels()
        if simulated() or not staged.packet_bytes or not staged.n:
            return 1
        return verdict_cuda.lanes_for(staged.packet_bytes / staged.n)

    def read_verdicts(self, slot: Slot, n: int) -> np.ndarray:
        """Wait for the slot's verdicts (the one host wait of a decode call; a chunk staged
        after them is not waited for) and return them."""
        if n:
            self.wait(slot.judged)
        return slot.scratch["verdicts"][1][:n]

    def build_padded(self, staged: Staged, slot: Slot, row_packet: np.ndarray, pad_id: int,
                     outs: dict) -> None:
        _, build_cuda = _kernels()
        n = row_packet.shape[0]
        if not n:
            return
        rows = self.upload(slot, "rows", row_packet)
        self.launch(build_cuda.build_padded_cuda, n, 1, build_cuda.BUILD_BLOCK)(
            staged.data, staged.offsets, rows, np.int64(pad_id), outs["input_ids"].kernel,
            outs["labels"].kernel, outs["attention_mask"].kernel, self.tables["width"],
            self.tables["masked"])

    def build_packed(self, staged: Staged, slot: Slot, rows: np.ndarray, cum: np.ndarray,
                     start: int, windows: int, outs: dict, wins: np.ndarray = NO_WINS) -> None:
        _, build_cuda = _kernels()
        if not windows:
            return
        n = rows.shape[0]
        # one copy for the three (``wins``: each window's start, if aligned to documents)
        plan = self.upload(slot, "rows", np.concatenate([rows, cum, wins]))
        seq = outs["x"].kernel.shape[1]
        threads = windows * (seq + 1) if wins.shape[0] else windows * seq + 1
        self.launch(build_cuda.build_packed_cuda, threads, build_cuda.BUILD_BLOCK,
                    build_cuda.BUILD_BLOCK)(
            staged.data, staged.offsets, plan[:n], plan[n:2 * n + 1], np.int64(start),
            plan[2 * n + 1:],
            outs["x"].kernel[:windows], outs["y"].kernel[:windows], self.tables["width"],
            self.tables["masked"])

    def build_documents(self, slot: Slot, doc_cum: np.ndarray, start: int, windows: int,
                        cu: np.ndarray, outs: dict, wins: np.ndarray = NO_WINS) -> None:
        _, build_cuda = _kernels()
        if not windows:
            return
        n = doc_cum.shape[0]
        dev = self.upload(slot, "documents", np.concatenate([doc_cum, wins]))  # one copy
        seq = outs["position_ids"].kernel.shape[1]
        self.launch(build_cuda.build_documents_cuda, windows * seq, build_cuda.BUILD_BLOCK,
                    build_cuda.BUILD_BLOCK)(
            dev[:n], np.int64(start), dev[n:], outs["position_ids"].kernel[:windows],
            outs["document_ids"].kernel[:windows])
        _, host = self.scratch(slot, "cu_seqlens", cu.shape[0], np.int32)
        host[:cu.shape[0]] = cu
        self.h2d(outs["cu_seqlens"].kernel[:cu.shape[0]], host[:cu.shape[0]])

    def build_packing(self, staged: Staged, slot: Slot, plan: dict, pad_id: int,
                      outs: dict) -> None:
        _, build_cuda = _kernels()
        n_rows = plan["row_docs"].shape[0] - 1
        if n_rows <= 0:
            return
        parts = [plan[k] for k in ("doc_packet", "doc_col", "doc_len", "row_docs")]
        cuts = np.cumsum([0] + [p.shape[0] for p in parts])
        dev = self.upload(slot, "rows", np.concatenate(parts))  # one copy for the four
        doc_packet, doc_col, doc_len, row_docs = (dev[a:b] for a, b in zip(cuts[:-1], cuts[1:]))
        self.launch(build_cuda.build_packing_cuda, n_rows, 1, build_cuda.BUILD_BLOCK)(
            staged.data, staged.offsets, doc_packet, doc_col, doc_len, row_docs,
            np.int64(pad_id), outs["input_ids"].kernel, outs["labels"].kernel,
            outs["attention_mask"].kernel, outs["position_ids"].kernel, self.tables["width"],
            self.tables["masked"])
        cu = plan["cu_seqlens"]
        _, host = self.scratch(slot, "cu_seqlens", cu.shape[0], np.int32)
        host[:cu.shape[0]] = cu
        self.h2d(outs["cu_seqlens"].kernel[:cu.shape[0]], host[:cu.shape[0]])

    # ------------------------------------------------------------------------ slot ordering
    def acquire(self, slot: Slot) -> None:
        if slot.ready is None:  # made once per slot, reused for every chunk
            slot.ready, slot.released = self.new_event(), self.new_event()
            slot.judged = self.new_event()

    def claim(self, slot: Slot) -> None:
        """Before the build writes the slot's outputs: the consumer's work on the slot's last
        chunk comes first (on the compute stream; the host does not wait)."""
        if slot.released_recorded:
            slot.released.wait(self.compute_stream)
            slot.released_recorded = False
        for buffer in slot.outputs.values():  # DeviceArray consumers (output="arrays")
            buffer.consumers.fence(self.compute_stream)

    def finish(self, slot: Slot) -> None:
        slot.ready.record(self.compute_stream)

    def synchronize_slot(self, slot: Slot) -> None:
        if slot.ready is not None:
            self.wait(slot.ready)

    def synchronize(self) -> None:
        self.copy_stream.synchronize()
        self.compute_stream.synchronize()
        self.counters.host_waits += 1

    # ------------------------------------------------------------------- the consumer's side
    def _stream_of(self, handle: int) -> Any:
        """Numba's handle on the consumer's stream (0, torch's default stream, is the legacy
        default stream); call with this engine's device current."""
        return external(handle or 1)

    def consumer_wait(self, slot: Slot, handle: int | None) -> None:
        """Make the consumer's stream (``handle``) wait until the slot's chunk is built (in
        the consumer's thread, with this engine's device current for the call only)."""
        if handle is not None:
            with self.activated():
                slot.ready.wait(self._stream_of(handle))

    def release(self, slot: Slot, handle: int | None) -> None:
        """The consumer is done with the slot's chunk: mark the end of its work on it."""
        if handle is not None:
            with self.activated():
                slot.released.record(self._stream_of(handle))
            slot.released_recorded = True


__all__ = ["CudaEngine"]
