"""The one-batch decode API on the host: ``CpuDecoder``, the ``CudaDecoder``'s twin over
``ndp.engine.reference`` (chosen by ``ndp.Decoder``, ``ndp.engine.decoder``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ndp.engine.reference import PackedBatch, PaddedBatch, PaddedBuffers, decode_packed, decode_padded
from ndp.errors import ConfigError, renamed
from ndp.wire.packet import as_u8


@dataclass
class _Done:
    """A batch decoded synchronously, with the same ``result()`` as a queued GPU batch."""

    value: Any

    def result(self) -> Any:
        return self.value


class CpuDecoder:
    """Decode on the host's cores (``ndp.engine.reference``), with the ``CudaDecoder`` API."""

    backend = "cpu"

    def __init__(self, *, ring: int = 3, device_budget: int | None = None) -> None:
        if ring < 2:
            raise ConfigError(f"ring must be >= 2, got {ring}")
        self.ring = ring
        self.device_budget = device_budget  # unused: host memory holds everything
        self._padded: list[PaddedBuffers | None] = [None] * ring
        self._packed: list[tuple[np.ndarray, np.ndarray] | None] = [None] * ring
        self._next = 0

    def resident(self, shard: Any, *, name: str = "shard") -> np.ndarray:
        """The shard's bytes as a uint8 array (host memory is where the CPU decodes from)."""
        data = shard.data if hasattr(shard, "data") and not isinstance(shard, np.ndarray) else shard
        return as_u8(data)

    def _slot(self) -> int:
        slot = self._next
        self._next = (self._next + 1) % self.ring
        return slot

    @renamed(max_seq_length="seq_len")
    def submit_padded(self, source: Any, offsets: Any, *, seq_len: int,
                      pad_token_id: int = 0) -> _Done:
        return _Done(self.decode_padded(source, offsets, seq_len=seq_len,
                                        pad_token_id=pad_token_id))

    @renamed(max_seq_length="seq_len")
    def decode_padded(self, source: Any, offsets: Any, *, seq_len: int,
                      pad_token_id: int = 0) -> PaddedBatch:
        """``ndp.decode_padded`` into this decoder's ring of reused buffers."""
        if seq_len < 1:
            raise ConfigError(f"seq_len must be >= 1, got {seq_len}")
        n = int(np.asarray(offsets).reshape(-1).shape[0])
        slot = self._slot()
        buffers = self._padded[slot]
        if (buffers is None or buffers.input_ids.shape[0] < n
                or buffers.input_ids.shape[1] != seq_len):
            rows = max(64, 1 << max(0, (n - 1).bit_length()))
            buffers = self._padded[slot] = PaddedBuffers.allocate(rows, seq_len)
        return decode_padded(source, offsets, seq_len=seq_len,
                             pad_token_id=pad_token_id, out=buffers)

    def decode_packed(self, source: Any, offsets: Any, *, batch_size: int | None, seq_len: int,
                      start: int = 0) -> PackedBatch:
        """``ndp.decode_packed`` into this decoder's ring of reused buffers."""
        slot = self._slot()
        if batch_size is None:  # the size is known only after decoding: no reuse
            return decode_packed(source, offsets, batch_size=None, seq_len=seq_len, start=start)
        out = self._packed[slot]
        if out is None or out[0].shape[0] < batch_size or out[0].shape[1] != seq_len:
            out = self._packed[slot] = (np.empty((batch_size, seq_len), np.int64),
                                        np.empty((batch_size, seq_len), np.int64))
        return decode_packed(source, offsets, batch_size=batch_size, seq_len=seq_len,
                             start=start, out=out)

    def synchronize(self) -> None:
        """Nothing to wait for: CPU decode is synchronous."""
