"""Device memory, streams and the DLPack handoff for the ``cuda`` backend.

Memory is allocated with Numba (``cuda.device_array`` / ``cuda.pinned_array``), once, and reused;
kernels are launched on Numba streams. What leaves ndp is a ``DeviceArray``: a zero-copy view
that any DLPack consumer takes (``torch.from_dlpack``, ``cupy.from_dlpack``, ``jax.dlpack``) and
that orders the consumer after the kernels that wrote it:

* ``__dlpack__(stream=S)`` makes the consumer's stream ``S`` wait on the event recorded after
  the kernels that wrote the array (its ``ready`` event; without one, on everything queued on
  ndp's stream so far, through CuPy, which implements the DLPack stream rules). No host
  synchronisation, and the consumer does not wait for chunks ndp queued after this one. An
  array the Loader's ring orders itself (torch output: ``ndp.loader.pipeline.serve``) is handed over
  with no stream work at all;
* the consumer's stream is remembered, and before ndp writes the same buffer again it makes its
  own stream wait for everything the consumer had queued on ``S`` up to that moment (one event,
  made once per buffer and reused). A buffer is therefore never overwritten while queued
  consumer work still reads it, as long as that work was queued before the call that reuses the
  buffer (see ``ndp.engine.cuda_decoder`` for when that is), and as long as ``S`` still exists
  then: a consumer that destroys its stream while ndp's arrays are in use must synchronise it
  first (torch's streams are pooled and never destroyed);
* a consumer that takes the array through ``__cuda_array_interface__`` instead is ordered after
  the kernels on import (the interface names ndp's stream, CAI v3), but its own stream is not
  known to ndp: ndp fences the legacy default stream (CuPy's and Numba's default) before reuse,
  and work on any other stream must be finished, or the data copied, before the buffer comes
  round again.

Under Numba's CUDA simulator the "device" is host memory: ``DeviceArray`` then wraps a NumPy
array and DLPack hands out CPU tensors; streams and events do nothing.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from ndp.engine.backend import simulated

#: DLPack's name for "the legacy default stream" (what ``stream=None`` means on CUDA)
LEGACY_DEFAULT_STREAM = 1
#: DLPack's "consumer asks for no synchronisation"
NO_SYNC = -1


def _cuda():
    from numba import cuda

    return cuda


class Consumers:
    """The streams that imported a buffer through DLPack since ndp last wrote it."""

    __slots__ = ("streams", "_event", "counters")

    def __init__(self, counters: Any = None) -> None:
        self.streams: set[int] = set()
        self._event: Any = None  # made on the first fence, reused for every later one
        self.counters = counters

    def fence(self, stream: Any) -> None:
        """Make ``stream`` (ndp's) wait for the work queued so far on every consumer stream,
        then forget them: call before writing the buffer again. One event serves every
        fence: a stream's wait takes the event as it was recorded when the wait is queued."""
        if self.streams and not simulated():
            if self._event is None:
                self._event = new_event(self.counters)
            for ptr in self.streams:
                self._event.record(external(ptr))
                self._event.wait(stream)
        self.streams.clear()


class DeviceArray:
    """A device array produced by ndp on a stream; hand it to any DLPack consumer.

    ``shape``, ``dtype`` and ``ndim`` are those of the array; ``copy_to_host()`` waits for the
    producing stream and returns a NumPy copy (for tests and inspection, not the hot path).
    """

    __slots__ = ("_array", "_stream", "_consumers", "_counters", "_ready", "_ordered")

    def __init__(self, array: Any, stream: Any, consumers: Consumers,
                 counters: Any = None, *, ready: Any = None, ordered: bool = False) -> None:
        self._array = array  # cupy.ndarray on a device, numpy.ndarray under the simulator
        self._stream = stream  # the Numba stream that writes it
        self._consumers = consumers
        self._counters = counters  # ndp.engine.counters.Counters of the decoder that made it
        #: the event recorded after the kernels that wrote it (None: order after the stream)
        self._ready = ready
        #: the consumer's stream is ordered by the caller (the ring, ``ndp.loader.pipeline.serve``)
        self._ordered = ordered

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._array.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._array.dtype)

    @property
    def ndim(self) -> int:
        return len(self._array.shape)

    def __len__(self) -> int:
        return self._array.shape[0]

    def __repr__(self) -> str:
        where = "simulated device" if simulated() else "cuda"
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, on {where})"

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._array.__dlpack_device__()

    def __dlpack__(self, *, stream: int | None = None, max_version=None, dl_device=None,
                   copy=None):
        kwargs = {}
        if max_version is not None:
            kwargs["max_version"] = max_version
        if dl_device is not None:
            kwargs["dl_device"] = dl_device
        if copy is not None:
            kwargs["copy"] = copy
        if simulated():
            capsule = self._array.__dlpack__(**kwargs)
        else:
            capsule = self._export(stream, kwargs)
        if self._counters is not None:  # counted once it worked (a consumer may retry)
            self._counters.dlpack_exports += 1
        return capsule

    def _export(self, stream: int | None, kwargs: dict) -> Any:
        """The capsule, with the consumer's stream ordered (see the module docstring)."""
        consumer = LEGACY_DEFAULT_STREAM if stream is None else int(stream)
        if self._ordered or consumer == NO_SYNC:
            with self._array.device:
                return self._array.__dlpack__(stream=NO_SYNC, **kwargs)
        if self._ready is not None:  # after this array's own kernels, not all queued since
            from ndp.engine.gpu import activate

            with activate(int(self._array.device.id)):
                capsule = self._array.__dlpack__(stream=NO_SYNC, **kwargs)
                self._ready.wait(external(consumer))
        else:
            import cupy

            # CuPy orders the consumer's stream after its *current* stream: make that ours,
            # on the array's device (the consumer's thread may have another one current)
            with self._array.device, cupy.cuda.ExternalStream(int(self._stream.handle)):
                capsule = self._array.__dlpack__(stream=stream, **kwargs)
        self._consumers.streams.add(consumer)
        return capsule

    @property
    def __cuda_array_interface__(self) -> dict:
        if simulated():
            raise AttributeError("no __cuda_array_interface__ under the CUDA simulator")
        cai = dict(self._array.__cuda_array_interface__)
        cai["stream"] = int(self._stream.handle) or LEGACY_DEFAULT_STREAM
        if not self._ordered:  # the consumer's stream is unknown: fence the default one
            self._consumers.streams.add(LEGACY_DEFAULT_STREAM)
        return cai

    @property
    def array(self) -> Any:
        """The array itself: a ``cupy.ndarray`` on a device, a NumPy array under the simulator
        (work on it inside ``producer_stream(self)``)."""
        return self._array

    @property
    def stream(self) -> Any:
        """The Numba stream that writes this array."""
        return self._stream

    def rows(self, start: int, stop: int) -> DeviceArray:
        """Rows ``[start, stop)``: a view, made on the same stream, with the same consumers."""
        return DeviceArray(self._array[start:stop], self._stream, self._consumers,
                           self._counters, ready=self._ready, ordered=self._ordered)

    def copy_to_host(self) -> np.ndarray:
        """A NumPy copy, after the producing stream has finished writing it."""
        self._stream.synchronize()
        if simulated():
            return np.array(self._array)
        return self._array.get()


def producer_stream(array: DeviceArray) -> Any:
    """A context in which CuPy work is queued on ``array``'s producing stream (so it runs after
    the kernels that wrote it); a no-op under the simulator."""
    if simulated():
        import contextlib

        return contextlib.nullcontext()
    import cupy

    return cupy.cuda.ExternalStream(int(array.stream.handle))


def array_module(array: Any) -> Any:
    """NumPy for host arrays (and the simulator's), CuPy for device arrays."""
    if isinstance(array, DeviceArray) and not simulated():
        import cupy

        return cupy
    return np


def wrap_like(template: DeviceArray, array: Any) -> DeviceArray:
    """A ``DeviceArray`` for ``array``, made on ``template``'s stream (a fresh allocation: no
    ring reuse, so no consumer bookkeeping is needed beyond DLPack's ordering)."""
    return DeviceArray(array, template.stream, Consumers())


class Buffer:
    """One device allocation (made once) and its consumer bookkeeping.

    ``kernel`` is the array kernels take (a Numba device array); ``view(n)`` hands out the first
    ``n`` rows as a ``DeviceArray``.
    """

    __slots__ = ("kernel", "_export", "consumers", "counters")

    def __init__(self, shape: tuple[int, ...] | int, dtype: Any, counters: Any = None) -> None:
        cuda = _cuda()
        self.kernel = cuda.device_array(shape, dtype=dtype)
        if simulated():
            self._export = self.kernel._ary  # the simulator's device array is a NumPy array
        else:
            import cupy

            self._export = cupy.asarray(self.kernel)  # zero-copy view of the same memory
        self.consumers = Consumers(counters)
        self.counters = counters

    @property
    def export(self) -> Any:
        """The memory as a CuPy array (a NumPy array under the simulator)."""
        return self._export

    def shaped(self, rows: int, cols: int) -> Buffer:
        """The first ``rows * cols`` elements of this (1-D) buffer as ``rows`` rows of ``cols``:
        the same memory and consumer bookkeeping, nothing allocated (a batch shape that
        changes with the step, ``ndp.loader.planning.shapes``)."""
        view = Buffer.__new__(Buffer)
        n = rows * cols
        view.kernel = self.kernel[:n].reshape(rows, cols)
        view._export = self._export[:n].reshape(rows, cols)
        view.consumers, view.counters = self.consumers, self.counters
        return view

    @property
    def nbytes(self) -> int:
        return int(self._export.nbytes)

    def leased(self, stream: Any, array: Any, *, ready: Any = None,
               ordered: bool = False) -> DeviceArray:
        """``array`` (over this buffer's memory, ``ndp.loader.pipeline.serve.held``) as a
        ``DeviceArray``
        that shares this buffer's consumer bookkeeping (``ready``, ``ordered``: as
        ``DeviceArray`` takes them)."""
        return DeviceArray(array, stream, self.consumers, self.counters, ready=ready,
                           ordered=ordered)

    def view(self, stream: Any, rows: int | None = None, start: int = 0, *,
             ready: Any = None) -> DeviceArray:
        """Rows ``[start, rows)`` (all of them with ``rows=None``) as a ``DeviceArray``, ordered
        after ``ready`` (an event recorded after the kernels that wrote them) if given."""
        array = self._export if rows is None and not start else self._export[start:rows]
        return DeviceArray(array, stream, self.consumers, self.counters, ready=ready)


_EXTERNAL: dict[tuple[int, int], Any] = {}


def external(handle: int) -> Any:
    """Numba's handle on a consumer's stream (``handle`` as DLPack and torch give it: 1 is the
    legacy default stream) in the current context, made once per context and stream."""
    cuda = _cuda()
    context = cuda.current_context()
    key = (id(context), handle)
    stream = _EXTERNAL.get(key)
    if stream is None:
        stream = _EXTERNAL[key] = cuda.external_stream(handle)
    return stream


def configure(kernel: Any, grid: int, block: int, stream: Any) -> Any:
    """``kernel[grid, block, stream]``: a launcher to keep and call (building one costs more than
    launching it), without Numba's warning that a grid under 128 blocks under-uses the GPU.

    ndp sizes its grids on purpose (one block for a scan, as many as the work for small
    batches), and Numba warns when the launcher is built, so only ndp's own launchers are
    silenced: the filter lives for this call, and the user's warnings are left alone. It matches
    the message, not the class: numba-cuda 0.30 raises its own ``numba.cuda.core.errors``
    class, not ``numba.core.errors``'s (seen on an H100: the first filter missed it)."""
    with warnings.catch_warnings():
        # Numba colours its messages, hence the leading .*
        warnings.filterwarnings("ignore", message=r".*Grid size \d+ will likely result in GPU "
                                                  r"under-utilization")
        return kernel[grid, block, stream]


def pinned(shape: tuple[int, ...] | int, dtype: Any) -> np.ndarray:
    """Page-locked host memory (plain memory under the simulator), for async copies."""
    return _cuda().pinned_array(shape, dtype=dtype)


def new_stream() -> Any:
    """A new Numba stream that does not synchronise with the legacy default stream, so ndp's
    copies and kernels overlap the training job's work (torch runs on that stream unless told
    otherwise). The CuPy stream that owns it lives as long as the returned object."""
    cuda = _cuda()
    if simulated():
        return cuda.stream()
    import cupy

    owner = cupy.cuda.Stream(non_blocking=True)
    stream = cuda.external_stream(owner.ptr)
    stream.ndp_owner = owner  # keep the CUDA stream alive as long as Numba's handle to it
    return stream


def new_event(counters: Any = None) -> Any:
    """An event for ordering only (no timing, which makes record and wait cheaper); counted in
    ``counters.events_created`` if given."""
    cuda = _cuda()
    if counters is not None:
        counters.events_created += 1
    return cuda.event() if simulated() else cuda.event(timing=False)


def device_memory_info() -> tuple[int, int]:
    """(free, total) bytes of device memory; the simulator's "device" claims 1 GiB."""
    if simulated():
        return 1 << 30, 1 << 30
    free, total = _cuda().current_context().get_memory_info()
    return int(free), int(total)
