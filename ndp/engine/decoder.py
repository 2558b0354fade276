"""One decode API for both backends: ``ndp.Decoder(backend="auto")``.

``Decoder`` returns a ``CudaDecoder`` (``ndp.engine.cuda_decoder``) when a GPU can be used and a
``CpuDecoder`` otherwise (``ndp.engine.backend`` says how the choice is made). Both have the same
methods and return the same batches for the same inputs, bit for bit; only where the arrays
live differs (``DeviceArray`` on the device, NumPy on the host). Both reuse their output
buffers round-robin over ``ring`` slots, so on either backend a batch stays valid until ``ring``
further batches have been decoded by the same decoder.

Decoders are not thread-safe: use one per thread.
"""

from __future__ import annotations

from ndp.engine.backend import resolve_backend
from ndp.engine.cpu_decoder import CpuDecoder

__all__ = ["CpuDecoder", "Decoder"]


def Decoder(*, backend: str = "auto", ring: int = 3, device_budget: int | None = None):  # noqa: N802
    """A ``CudaDecoder`` or ``CpuDecoder`` for ``backend`` ("auto", "cuda" or "cpu").

    ``ring``: how many batches' buffers are reused round-robin (a batch stays valid for that
    many further decodes); ``device_budget``: bytes of device memory that ``resident`` shards
    may take (GPU only; default three quarters of what is free).
    """
    if resolve_backend(backend) == "cuda":
        from ndp.engine.cuda_decoder import CudaDecoder

        return CudaDecoder(ring=ring, device_budget=device_budget)
    return CpuDecoder(ring=ring, device_budget=device_budget)
