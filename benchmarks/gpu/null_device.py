"""A counting no-op device for ``gpu_host.py``: the Loader's CUDA path with every device call
replaced by a counter, so its host cost can be measured on a machine with no GPU.

Import this module before numba: it switches Numba's CUDA simulator on, so that numba.cuda
imports without a driver and device arrays are host arrays that are never written. ``null_loader``
builds an ``ndp.Loader(backend="cuda")`` whose engine is a ``NullEngine`` and whose stage is
``NullShards``; everything else is the CUDA path's own code, run as it runs on a GPU, with
``has_streams`` true (the consumer's stream handshake runs):

* kept (host work): planning, index entries, the pread(2) of shard pieces into the bounce
  buffers and their header checks, the plan and row uploads' host side (filling pinned scratch),
  the layout of every batch, slot and ring bookkeeping, the lease wraps, torch tensors from
  DLPack (CPU tensors here: ``torch.from_dlpack`` of a NumPy capsule), stats and state;
* replaced by a counter (``DeviceCalls``): kernel launches, host<->device copies, event
  creation, records, stream waits and synchronisations, making a device current, the query of
  torch's current stream. The verdict "kernel" writes the verdicts the CPU backend gives for
  the same packets (worked out once, before any timing: ``truth``), a gather of one int64 a
  packet, timed on its own (``own_seconds``) so it can be told apart.

What it cannot show is the host cost of the device calls themselves (driver and Python wrapper
time per launch, copy, event call and DLPack wrap): those are counted per batch here and timed
on a GPU by ``bench_gpu_loader.py``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from typing import Any

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # before numba is imported anywhere

import numpy as np  # noqa: E402

#: the device calls counted, in the order ``gpu_host.py`` reports them
CALLS = ("launch", "memcpy_h2d", "memcpy_d2h", "event_create", "event_record",
         "stream_wait_event", "event_synchronize", "stream_synchronize", "set_device",
         "current_stream_query")


class DeviceCalls(Counter):
    """Counts of device calls by kind (``CALLS``)."""


class NullEvent:
    __slots__ = ("calls",)

    def __init__(self, calls: DeviceCalls) -> None:
        self.calls = calls

    def record(self, stream: Any = None) -> None:
        self.calls["event_record"] += 1

    def wait(self, stream: Any = None) -> None:
        self.calls["stream_wait_event"] += 1

    def synchronize(self) -> None:
        self.calls["event_synchronize"] += 1


class NullStream:
    __slots__ = ("calls", "handle")

    def __init__(self, calls: DeviceCalls, handle: int) -> None:
        self.calls, self.handle = calls, handle

    def synchronize(self) -> None:
        self.calls["stream_synchronize"] += 1


def _noop(*args: Any) -> None:
    return None


def engine_class() -> type:
    """``NullEngine``: ``ndp.engine.cuda.CudaEngine`` with its device calls counted, not made."""
    from ndp.engine.cpu import CpuEngine
    from ndp.engine.cuda import CudaEngine

    class NullEngine(CudaEngine):
        has_streams = True  # as on a GPU: the consumer's stream handshake runs

        def __init__(self, counters: Any = None, *, device: int | None = None) -> None:
            CpuEngine.__init__(self, counters)
            self.calls = DeviceCalls()
            self.device = 0
            self.copy_stream = NullStream(self.calls, 11)
            self.compute_stream = NullStream(self.calls, 12)
            self.tables = dict.fromkeys(("crc", "width", "masked", "skip"))
            self.no_limits = np.empty(0, np.int64)
            self._max_grid = 8 * 132  # an H100's multiprocessors, 8 blocks each
            self._launchers: dict = {}
            self.truth: np.ndarray | None = None  # every packet's verdict (set by null_loader)
            self.last_packets = np.empty(0, np.int64)  # the packets NullShards staged last
            self.own_seconds = 0.0  # time spent filling verdicts (the null device's own work)

        def new_event(self) -> NullEvent:
            self.counters.events_created += 1
            self.calls["event_create"] += 1
            return NullEvent(self.calls)

        def activated(self) -> Any:
            self.calls["set_device"] += 1
            return contextlib.nullcontext()

        def enter_thread(self) -> None:
            self.calls["set_device"] += 1

        def h2d(self, dst: Any, src: np.ndarray, stream: Any = None) -> None:
            if src.shape[0] == 0:
                return
            self.calls["memcpy_h2d"] += 1
            self.counters.h2d_copies += 1
            self.counters.h2d_bytes += int(src.nbytes)

        def d2h(self, dst: np.ndarray, src: Any) -> None:
            self.calls["memcpy_d2h"] += 1
            self.counters.d2h_copies += 1
            self.counters.d2h_bytes += int(dst.nbytes)

        def launch(self, kernel: Any, items: int, per_block: int, block: int) -> Any:
            self.calls["launch"] += 1
            self.counters.launches += 1
            return _noop

        def submit_verdicts(self, staged: Any, slot: Any, vocab: int) -> None:
            n = staged.n
            dev, host = self.scratch(slot, "verdicts", n, np.int64)
            if n:
                self.launch(None, n, 1, 1)
                t = time.perf_counter()
                host[:n] = self.truth[self.last_packets]
                self.own_seconds += time.perf_counter() - t
                self.d2h(host[:n], dev[:n])
                slot.judged.record(self.compute_stream)

        def _stream_of(self, handle: int) -> NullStream:
            return NullStream(self.calls, handle)

        def synchronize(self) -> None:
            self.calls["stream_synchronize"] += 2
            self.counters.host_waits += 1

    return NullEngine


def shards_class() -> type:
    """``NullShards``: the GPU's stage, telling the engine which packets it staged."""
    from ndp.loader.pipeline.device_shards import DeviceShards

    class NullShards(DeviceShards):
        def stage(self, packets: np.ndarray, slot: Any, entries: Any = None,
                  shard_ids: Any = None, keep: tuple = ()) -> Any:
            self.engine.last_packets = packets
            return super().stage(packets, slot, entries, shard_ids, keep=keep)

    return NullShards


def verdicts_of(corpus: Any) -> np.ndarray:
    """Every packet of ``corpus`` (an ``ndp.store.corpus.Corpus``): its verdict as the CPU
    backend gives it (by global packet number)."""
    from ndp.engine.cpu import CpuEngine, Slot
    from ndp.loader.pipeline.stage import HostStager

    engine, stager, slot = CpuEngine(), HostStager(corpus), Slot(0)
    out = np.empty(len(corpus), np.int64)
    step = 1 << 16
    for a in range(0, len(corpus), step):
        packets = np.arange(a, min(a + step, len(corpus)), dtype=np.int64)
        staged = stager.stage(packets, slot)
        engine.submit_verdicts(staged, slot, 1 << 31)
        out[a: a + packets.shape[0]] = engine.read_verdicts(slot, staged.n)
    return out


@contextlib.contextmanager
def null_device(calls_out: list) -> Any:
    """Within the block, ``ndp.Loader(backend="cuda")`` runs on the null device; the engines
    made are appended to ``calls_out``; torch's current stream is a counted constant."""
    import ndp.adapters.torch as torch_adapter
    import ndp.engine.cuda as cuda_module
    import ndp.loader.pipeline.device_shards as shards_module

    null_engine, null_shards = engine_class(), shards_class()
    made = calls_out

    class Tracked(null_engine):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    def current_stream_handle() -> int:
        made[-1].calls["current_stream_query"] += 1
        return 0  # torch's default stream

    saved = (cuda_module.CudaEngine, shards_module.DeviceShards,
             torch_adapter.current_stream_handle)
    cuda_module.CudaEngine, shards_module.DeviceShards = Tracked, null_shards
    torch_adapter.current_stream_handle = current_stream_handle
    try:
        yield
    finally:
        (cuda_module.CudaEngine, shards_module.DeviceShards,
         torch_adapter.current_stream_handle) = saved
