"""torch adapter: batches as ``torch.Tensor`` without a copy.

Device arrays go through ``torch.from_dlpack``, which passes torch's current stream to
``DeviceArray.__dlpack__``: that stream is ordered after ndp's kernels, and ndp waits for the
work queued on it before it writes the same ring buffer again (``ndp.engine.device``). Host arrays
(the ``cpu`` backend) become tensors over the same memory with ``torch.from_numpy``. Either way
the tensors alias the decoder's ring: they stay valid until ``ring`` more batches are decoded;
``.clone()`` what must live longer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ndp.engine.reference import PackedBatch, PaddedBatch

PADDED_FIELDS = ("input_ids", "labels", "attention_mask")
PACKED_FIELDS = ("x", "y")


def tensor(array: Any) -> torch.Tensor:
    """A tensor over the same memory as an ndp array (NumPy or ``DeviceArray``)."""
    if isinstance(array, np.ndarray):
        return torch.from_numpy(array)
    return torch.from_dlpack(array)


def current_stream_handle() -> int:
    """The raw handle of torch's current CUDA stream on the current device (what the consumer's
    work is queued on, unless told otherwise)."""
    return int(torch.cuda.current_stream().cuda_stream)


def to_torch(batch: PaddedBatch | PackedBatch) -> dict[str, torch.Tensor]:
    """``{"input_ids", "labels", "attention_mask"}`` of a padded batch, or ``{"x", "y"}`` of a
    packed one, as int64 tensors where the batch lives (``labels`` are not shifted, ``y`` is:
    ``ndp.loader.loader``, "Modes")."""
    if not isinstance(batch, (PaddedBatch, PackedBatch)):
        raise TypeError(f"to_torch takes a PaddedBatch or PackedBatch, got {type(batch).__name__}")
    fields = PADDED_FIELDS if isinstance(batch, PaddedBatch) else PACKED_FIELDS
    return {name: tensor(getattr(batch, name)) for name in fields}
