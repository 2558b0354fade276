"""Which backend decodes: ``cuda`` when a GPU can be used, ``cpu`` otherwise.

``backend="auto"`` (the default everywhere) picks ``cuda`` when Numba's CUDA target finds a real
device and CuPy (which hands the arrays to DLPack consumers) is installed, else ``cpu``; an
explicit ``"cpu"`` or ``"cuda"`` overrides it, and ``"cuda"`` without a usable GPU is an error
that says what is missing rather than a silent fall-back. Both backends return the same batches.

Under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1`` in the environment before Numba is
imported) the ``cuda`` backend runs its kernels as Python threads on host memory: slow, but
every kernel and the host logic around it can be tested against the CPU reference without a GPU.
Only an explicit ``backend="cuda"`` uses the simulator; ``"auto"`` picks ``cpu`` under it.
"""

from __future__ import annotations

import functools
import os
from typing import Literal

from ndp.errors import ConfigError

Backend = Literal["auto", "cpu", "cuda"]
BACKENDS = ("auto", "cpu", "cuda")


def simulated() -> bool:
    """Whether Numba's CUDA simulator stands in for the device."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"


@functools.lru_cache(maxsize=1)
def cuda_unavailable_reason() -> str | None:
    """``None`` if the ``cuda`` backend can run here, else why it cannot (for error messages)."""
    try:
        from numba import cuda
    except ImportError as exc:  # pragma: no cover - numba without its CUDA target
        return (f"numba's CUDA target cannot be imported ({exc}); "
                "pip install 'neural-datagram[cuda12]'")
    if simulated():
        return None
    try:
        if not cuda.is_available():
            return "no CUDA device or driver was found (numba.cuda.is_available() is False)"
    except Exception as exc:  # noqa: BLE001 - any driver failure means "no GPU here"
        return f"the CUDA driver failed to initialise ({exc})"
    try:
        import cupy  # noqa: F401
    except ImportError:
        return ("CuPy is not installed; pip install 'neural-datagram[cuda12]' "
                "(or 'neural-datagram[cuda13]')")
    return None


def resolve_backend(backend: str = "auto") -> Literal["cpu", "cuda"]:
    """``"cpu"`` or ``"cuda"`` for a requested backend; ``ConfigError`` for an unknown name or
    for ``"cuda"`` where no GPU can be used."""
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "cpu":
        return "cpu"  # without importing Numba's CUDA target (a quarter second) to ask
    reason = cuda_unavailable_reason()
    if backend == "cuda" and reason is not None:
        raise ConfigError(f"backend='cuda' was asked for, but {reason}; use backend='cpu'")
    if backend == "auto":
        return "cuda" if reason is None and not simulated() else "cpu"
    return backend  # type: ignore[return-value]
