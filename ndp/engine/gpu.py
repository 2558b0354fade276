"""Which GPU a Loader decodes on, and making it current where ndp's CUDA work runs.

A new thread has no current CUDA context: Numba gives it device 0, and CuPy its own current
device (0). So a rank of ``torchrun`` whose ``torch.cuda.set_device(LOCAL_RANK)`` came before the
Loader would otherwise build its streams and arena on its device and decode on device 0 in the
producer thread (mixed contexts, or every rank decoding on GPU 0). ``choose_device`` picks the
device once, at construction; ``activate`` makes it current for a block of code in the
constructing thread and in the consumer's (restoring what was current: torch's current device
in a user's thread is the user's); ``select`` makes it current for good in a thread ndp owns
(the producer). Under Numba's simulator there is one device and nothing to make current, but
every call is still made and counted here (``ACTIVATIONS``), so tests can see which device each
thread asked for.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

from ndp.engine.backend import simulated
from ndp.errors import ConfigError

#: (thread name, device, "select" or "activate") of every call, newest last, at most 256: what
#: tests look at (the simulator has one device, so nothing else shows which was asked for)
ACTIVATIONS: list[tuple[str, int, str]] = []
_LOG = threading.Lock()


def _log(device: int, how: str) -> None:
    with _LOG:
        ACTIVATIONS.append((threading.current_thread().name, device, how))
        del ACTIVATIONS[:-256]


def device_count() -> int:
    """CUDA devices this process sees (1 under the simulator)."""
    from numba import cuda

    return len(cuda.gpus)


def choose_device(device: int | None) -> int:
    """The device a Loader decodes on: ``device`` if given, else torch's current device if
    torch has initialised CUDA in this process, else ``LOCAL_RANK`` (set by torchrun and
    accelerate; a rank that sees one device, by ``CUDA_VISIBLE_DEVICES``, takes that one),
    else 0. ``ConfigError`` for a device this process does not see."""
    count = device_count()
    how = "device"
    if device is None:
        torch = sys.modules.get("torch")
        local = os.environ.get("LOCAL_RANK")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            device, how = int(torch.cuda.current_device()), "torch.cuda.current_device()"
        elif local is not None:
            try:
                device, how = int(local), "LOCAL_RANK"
            except ValueError:
                raise ConfigError(f"LOCAL_RANK={local!r} is not a number: set it right, or "
                                  f"pass `device` to the Loader") from None
            if count == 1:  # one visible device a rank (CUDA_VISIBLE_DEVICES): that one
                device = 0
        else:
            device, how = 0, "the default"
    if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device < count:
        raise ConfigError(f"`device`={device!r} (from {how}): this process sees {count} CUDA "
                          f"device(s), numbered 0 to {count - 1}; pass `device` to the Loader, "
                          f"or check CUDA_VISIBLE_DEVICES")
    return device


@contextlib.contextmanager
def activate(device: int) -> Iterator[None]:
    """``device`` current for Numba and CuPy in this thread for the block, and what was current
    before it after (a user's thread, where torch's current device is the user's)."""
    _log(device, "activate")
    if simulated():
        yield
        return
    import cupy
    from numba import cuda

    with cuda.gpus[device], cupy.cuda.Device(device):
        yield


def select(device: int) -> None:
    """``device`` current for good in this thread (one ndp started: the producer)."""
    _log(device, "select")
    if simulated():
        return
    import cupy
    from numba import cuda

    cuda.select_device(device)
    cupy.cuda.Device(device).use()
