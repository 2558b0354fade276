"""What every peer pipeline does with its batches, shared by ``peers.py``, ``peers_dali.py``
and ``peers_mosaicml.py`` (which runs in an environment of its own, without ndp: NumPy at
import, torch inside the functions): on a GPU, each batch to the device from pinned memory with
``non_blocking`` copies; SFT rows padded as ``transformers`` takes them."""

from __future__ import annotations

import numpy as np


def device_batch(x, y) -> dict:
    """``{"x": x, "y": y}``, on the GPU where there is one."""
    import torch

    if torch.cuda.is_available():
        return {"x": x.pin_memory().to("cuda", non_blocking=True),
                "y": y.pin_memory().to("cuda", non_blocking=True)}
    return {"x": x, "y": y}


class PadCollate:
    """Rows of ``T``: ``input_ids`` padded with ``pad``, ``labels`` -100 there, and the
    ``attention_mask``."""

    def __init__(self, T: int, pad: int) -> None:
        self.T, self.pad = T, pad

    def __call__(self, docs) -> dict:
        import torch

        ids = np.full((len(docs), self.T), self.pad, np.int64)
        attn = np.zeros((len(docs), self.T), np.int64)
        for r, d in enumerate(docs):
            d = np.asarray(d)[: self.T]
            ids[r, : d.shape[0]] = d
            attn[r, : d.shape[0]] = 1
        labels = np.where(attn == 1, ids, -100)
        return {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels),
                "attention_mask": torch.from_numpy(attn)}


def to_device(batch: dict) -> dict:
    """``batch``'s tensors on the GPU where there is one."""
    import torch

    if torch.cuda.is_available():
        return {k: v.pin_memory().to("cuda", non_blocking=True) for k, v in batch.items()}
    return batch
