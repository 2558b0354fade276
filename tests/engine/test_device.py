"""ndp.engine.device helpers that need no GPU: how launchers are configured, and the stream
protocol of ``DeviceArray`` with stand-ins for CuPy's array, Numba's events and streams (the
simulator skips that code, so it is driven here as it runs on a device)."""

from __future__ import annotations

import contextlib
import warnings

import pytest
from numba.core.errors import NumbaPerformanceWarning
# what numba-cuda 0.30's dispatcher really raises (seen on an H100): its own class, not a subclass
# of numba.core's, so a filter by numba.core's class missed it
from numba.cuda.core.errors import NumbaPerformanceWarning as CudaPerformanceWarning

import ndp.engine.device as device
from ndp.engine.counters import Counters
from ndp.engine.device import Consumers, DeviceArray, NO_SYNC, configure


class _Kernel:
    """Stands in for a Numba CUDA dispatcher, which warns when a small launch is configured (in
    bold, as Numba colours it)."""

    def __getitem__(self, config):
        grid = config[0]
        if grid < 128:
            warnings.warn(CudaPerformanceWarning(
                f"\x1b[1mGrid size {grid} will likely result in GPU under-utilization due to low "
                f"occupancy.\x1b[0m"))
        return ("launcher", config)


def test_ndp_launchers_are_configured_without_the_low_occupancy_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert configure(_Kernel(), 1, 32, "stream") == ("launcher", (1, 32, "stream"))
    assert caught == []


def test_the_users_own_warnings_are_left_alone():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        configure(_Kernel(), 1, 32, None)
        _Kernel()[1, 32, None]  # the user's launch, outside ndp: still warned about
        warnings.warn(NumbaPerformanceWarning("something else"))
    assert len(caught) == 2
    assert "Grid size 1" in str(caught[0].message) and "something" in str(caught[1].message)


class _Log(list):
    """What the stand-ins were asked to do, in order."""


class _Event:
    def __init__(self, log: _Log, name: str = "event") -> None:
        self.log, self.name = log, name

    def record(self, stream) -> None:
        self.log.append((self.name, "record", stream))

    def wait(self, stream) -> None:
        self.log.append((self.name, "wait", stream))


class _Device:
    """A CuPy device: a context manager with an id."""

    id = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _CupyArray:
    """A CuPy array as DeviceArray sees it: a device, a DLPack export, an interface."""

    device = _Device()

    def __init__(self, log: _Log, refuse_versions: bool = False) -> None:
        self.log, self.refuse_versions = log, refuse_versions

    def __getitem__(self, rows):
        return self  # a view of the same memory

    def __dlpack__(self, stream=None, **kwargs):
        if self.refuse_versions and "max_version" in kwargs:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        self.log.append(("cupy", "export", stream))
        return "capsule"

    @property
    def __cuda_array_interface__(self):
        return {"shape": (2,), "typestr": "<i4", "data": (1234, False), "version": 3}


class _Stream:
    handle = 77


@pytest.fixture
def on_a_device(monkeypatch):
    """``ndp.engine.device`` as on a GPU: not simulated, consumer streams by handle."""
    log = _Log()
    monkeypatch.setattr(device, "simulated", lambda: False)
    monkeypatch.setattr(device, "external", lambda handle: ("stream", handle))
    made = []

    def new_event(counters=None):
        if counters is not None:
            counters.events_created += 1
        made.append(_Event(log, f"fence{len(made)}"))
        return made[-1]

    monkeypatch.setattr(device, "new_event", new_event)
    import ndp.engine.gpu as gpu

    monkeypatch.setattr(gpu, "activate", lambda dev: contextlib.nullcontext())
    return log


def test_a_consumer_waits_on_the_chunks_own_event_not_on_everything_queued(on_a_device):
    """F7: the consumer's stream waits on the event recorded after the kernels that wrote the
    array; CuPy is asked for no synchronisation (its own would order the consumer after all
    that ndp's stream holds by then: the next chunks' work). The stream is fenced later."""
    log, counters, consumers = on_a_device, Counters(), Consumers()
    ready = _Event(log, "ready")
    array = DeviceArray(_CupyArray(log), _Stream(), consumers, counters, ready=ready)
    assert array.__dlpack__(stream=5) == "capsule"
    assert log == [("cupy", "export", NO_SYNC), ("ready", "wait", ("stream", 5))]
    assert consumers.streams == {5} and counters.dlpack_exports == 1


def test_an_array_the_ring_orders_is_exported_with_no_stream_work(on_a_device):
    """torch output: the ring already made the consumer's stream wait on the chunk (and
    records its release), so the export does nothing more and registers nothing."""
    log, consumers = on_a_device, Consumers()
    array = DeviceArray(_CupyArray(log), _Stream(), consumers, Counters(),
                        ready=_Event(log, "ready"), ordered=True)
    array.rows(0, 1).__dlpack__(stream=5)
    assert log == [("cupy", "export", NO_SYNC)] and consumers.streams == set()


def test_an_export_is_counted_once_when_a_consumer_retries_without_max_version(on_a_device):
    """F10: torch asks for DLPack 1.0 first and retries without it on TypeError; the failed
    try is neither counted nor registered."""
    log, counters, consumers = on_a_device, Counters(), Consumers()
    array = DeviceArray(_CupyArray(log, refuse_versions=True), _Stream(), consumers, counters,
                        ready=_Event(log, "ready"))
    with pytest.raises(TypeError):
        array.__dlpack__(stream=5, max_version=(1, 0))
    assert counters.dlpack_exports == 0 and consumers.streams == set()
    array.__dlpack__(stream=5)
    assert counters.dlpack_exports == 1 and consumers.streams == {5}


def test_an_interface_consumer_gets_the_default_stream_fenced(on_a_device):
    """F5: a consumer through ``__cuda_array_interface__`` is ordered after ndp's stream on
    import (the interface names it); its own stream is unknown, so the legacy default stream
    (CuPy's and Numba's default) is fenced before the buffer is written again."""
    log, consumers = on_a_device, Consumers()
    cai = DeviceArray(_CupyArray(log), _Stream(), consumers).__cuda_array_interface__
    assert cai["stream"] == 77 and consumers.streams == {device.LEGACY_DEFAULT_STREAM}


def test_fences_reuse_one_event(on_a_device):
    """F9: every fence of a buffer records and waits on one event, made at the first."""
    log, counters = on_a_device, Counters()
    consumers = Consumers(counters)
    for round_ in range(3):
        consumers.streams.update({5, 6})
        consumers.fence("ndp")
        assert consumers.streams == set()
    assert counters.events_created == 1
    assert {name for name, *_ in log} == {"fence0"}
    assert [what for _, what, _ in log] == ["record", "wait"] * 6
