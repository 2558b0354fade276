"""GPU decode of one batch at a time: packet bytes in, training arrays out, on the device.

``CudaDecoder`` is the ``cuda`` backend of ``ndp.Decoder``: the same batches as the CPU reference
(``ndp.engine.reference``), bit for bit, with arrays that stay on the device and reach torch (or any
DLPack consumer) without a copy. It runs the primitives of ``ndp.engine.cuda`` that the Loader runs
on whole chunks (``ndp.loader.pipeline.chunks``): one verdict kernel, one small copy of the verdicts
back and
one wait for it, the rows laid out on the host, one build kernel. A training loop should use
``ndp.Loader``, which pays that per-call cost once per chunk of many batches; this API is for
decoding arbitrary packets (inspection, tests, custom pipelines).

Where the bytes come from:

* **host staging** (pass the shard as a NumPy/mmap array): the batch's packets are gathered into
  a pinned buffer (``ndp.kernels.stage``: a copy, no decoding) and moved by one copy, with each
  packet's limit, so its verdict is the one it gets in the shard itself;
* **device-resident** (``decoder.resident(shard)``): the shard is copied to the device once,
  within ``device_budget`` bytes, and each batch sends only its packet offsets.

The ring and how long a batch stays valid: output buffers are allocated once per ring slot
(``ring`` slots, 3 by default) and reused round-robin. A batch's arrays stay valid until
``ring`` further batches have been decoded by the same decoder. Work a consumer queued on a
stream that took the arrays through DLPack before that decode is ordered before the overwrite
(``ndp.engine.device``); reading them later, or from the host without synchronising, is a bug. Copy
what must live longer (``tensor.clone()``). ``status``, ``rows`` and ``lengths`` are host
arrays (they come from the verdicts the host already holds).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ndp.engine.cuda import CudaEngine
from ndp.engine.reference import DecodeStats, PackedBatch, PaddedBatch, StreamExhausted
from ndp.engine.cpu_decoder import _Done
from ndp.engine.device import Buffer, DeviceArray, device_memory_info
from ndp.engine.cpu import Slot, Staged
from ndp.errors import ConfigError, renamed
from ndp.kernels.stage import gather_packets, staged_size
from ndp.kernels.verdict import count, status_of, tokens_of
from ndp.wire.packet import as_u8


class ResidentShard:
    """A shard's bytes held in device memory; decode from it by passing it as ``source``."""

    def __init__(self, data: np.ndarray, buffer: Buffer, name: str) -> None:
        self.nbytes = int(data.shape[0])
        self.buffer = buffer
        self.name = name

    def __repr__(self) -> str:
        return f"ResidentShard({self.name!r}, {self.nbytes} bytes)"


class CudaDecoder:
    """Decode packets on the GPU (or Numba's simulator) into device-resident training arrays.

    ``ring``: output buffer sets reused round-robin (a batch stays valid for ``ring`` decodes);
    ``device_budget``: the most bytes of device memory ``resident`` may use for shards (None:
    what the device has free, less a quarter kept for the training job).
    """

    backend = "cuda"

    def __init__(self, *, ring: int = 3, device_budget: int | None = None) -> None:
        if ring < 2:
            raise ConfigError(f"ring must be >= 2 so a batch outlives the next, got {ring}")
        self.engine = CudaEngine()
        self.counters = self.engine.counters
        self.ring = ring
        self._slots = [Slot(i) for i in range(ring)]
        self._next = 0
        free, _ = device_memory_info()
        self.device_budget = device_budget if device_budget is not None else (free * 3) // 4
        self.resident_bytes = 0

    # ----------------------------------------------------------------------------- residency
    def resident(self, shard: Any, *, name: str = "shard") -> ResidentShard:
        """Copy a shard's bytes (array, bytes or ``ndp.Shard``) to the device once.

        ``ConfigError`` if it would take the shards held resident past ``device_budget``.
        """
        data = as_u8(shard.data if hasattr(shard, "data") and not isinstance(shard, np.ndarray)
                     else shard)
        need = int(data.shape[0])
        if self.resident_bytes + need > self.device_budget:
            raise ConfigError(
                f"{name}: {need} bytes would put {self.resident_bytes + need} bytes of shards on "
                f"the device, over device_budget={self.device_budget}; pass a larger "
                f"device_budget or decode from host memory (pass the array itself as source)"
            )
        with self.engine.activated():
            buffer = Buffer(max(need, 1), np.uint8, counters=self.counters)
            if need:  # on the compute stream, so the first decode is ordered after it (the
                # legacy stream's copy from pageable memory may still be landing when a
                # non-blocking stream's kernel starts)
                buffer.kernel[:need].copy_to_device(data, stream=self.engine.compute_stream)
        if need:
            self.counters.h2d_copies += 1
            self.counters.h2d_bytes += need
            self.counters.shard_copies += 1
        self.resident_bytes += need
        return ResidentShard(data, buffer, name)

    # ---------------------------------------------------------------------------- the public
    @renamed(max_seq_length="seq_len")
    def submit_padded(self, source: Any, offsets: Any, *, seq_len: int,
                      pad_token_id: int = 0) -> _Done:
        """``decode_padded``, with the ``.result()`` of the queued API (the host waits for the
        verdicts either way; the build is still running when it returns)."""
        return _Done(self.decode_padded(source, offsets, seq_len=seq_len,
                                        pad_token_id=pad_token_id))

    @renamed(max_seq_length="seq_len")
    def decode_padded(self, source: Any, offsets: Any, *, seq_len: int,
                      pad_token_id: int = 0) -> PaddedBatch:
        """As ``ndp.decode_padded``, on the device: one row per valid token packet, in packet
        order; the arrays are ``DeviceArray`` views valid for ``ring`` further decodes."""
        if seq_len < 1:
            raise ConfigError(f"seq_len must be >= 1, got {seq_len}")
        engine = self.engine
        slot, staged = self._stage(source, offsets)
        verdicts = engine.format_verdicts(staged, slot)
        rows = np.flatnonzero(verdicts >= 0).astype(np.int64)
        outs = engine.outputs(slot, "padded", rows.shape[0], seq_len)
        engine.build_padded(staged, slot, rows, pad_token_id, outs)
        engine.finish(slot)
        lengths = verdicts[rows].copy()
        stats = _stats(verdicts)
        stats.tokens = int(np.minimum(lengths, seq_len).sum())
        stats.truncated_tokens = int(lengths.sum()) - stats.tokens
        stream, n, ready = engine.compute_stream, rows.shape[0], slot.ready
        return PaddedBatch(
            input_ids=outs["input_ids"].view(stream, n, ready=ready),
            labels=outs["labels"].view(stream, n, ready=ready),
            attention_mask=outs["attention_mask"].view(stream, n, ready=ready), lengths=lengths,
            status=status_of(verdicts), rows=rows, stats=stats)

    def decode_packed(self, source: Any, offsets: Any, *, batch_size: int | None, seq_len: int,
                      start: int = 0) -> PackedBatch:
        """As ``ndp.decode_packed``, on the device."""
        if (batch_size is not None and batch_size < 1) or seq_len < 1:
            raise ConfigError(f"batch_size and seq_len must be >= 1, got {batch_size}, {seq_len}")
        engine = self.engine
        slot, staged = self._stage(source, offsets)
        verdicts = engine.format_verdicts(staged, slot)
        rows = np.flatnonzero(verdicts >= 0).astype(np.int64)
        cum = np.concatenate([[0], np.cumsum(tokens_of(verdicts)[rows])]).astype(np.int64)
        total = int(cum[-1])
        if batch_size is None:
            batch_size = max(0, (total - start - 1) // seq_len)
        need = start + batch_size * seq_len + 1
        if start < 0 or batch_size < 1 or need > total:
            engine.finish(slot)
            raise StreamExhausted(
                f"windows from token {start} need {max(need, start + seq_len + 1)} tokens, "
                f"the valid packets hold {total}", stream_tokens=total,
                status=status_of(verdicts))
        outs = engine.outputs(slot, "packed", batch_size, seq_len)
        engine.build_packed(staged, slot, rows, cum, start, batch_size, outs)
        engine.finish(slot)
        stats = _stats(verdicts)
        stats.tokens = batch_size * seq_len
        stream, ready = engine.compute_stream, slot.ready
        return PackedBatch(
            x=outs["x"].view(stream, batch_size, ready=ready),
            y=outs["y"].view(stream, batch_size, ready=ready),
            start=start, next_start=start + batch_size * seq_len, stream_tokens=total,
            status=status_of(verdicts), stats=stats)

    def synchronize(self) -> None:
        """Wait for everything queued so far."""
        self.engine.synchronize()

    # ----------------------------------------------------------------------------- internals
    def _stage(self, source: Any, offsets: Any) -> tuple[Slot, Staged]:
        """The next ring slot, and the batch's bytes and offsets on the device in it."""
        engine = self.engine
        offs = np.ascontiguousarray(offsets, dtype=np.int64).reshape(-1)
        n = int(offs.shape[0])
        slot = self._slots[self._next]
        self._next = (self._next + 1) % self.ring
        engine.acquire(slot)
        if isinstance(source, ResidentShard):
            dev = engine.upload(slot, "plan", offs)
            data = source.buffer.kernel[: max(source.nbytes, 1)]
            return slot, Staged(data, dev[:n], engine.no_limits, n)
        shard = as_u8(source)
        sizes = np.empty(n, np.int64)
        total = staged_size(shard, offs, sizes)
        dev_bytes, host_bytes = engine.scratch(slot, "bytes", max(total, 1), np.uint8)
        plan = np.empty(2 * n, np.int64)
        gather_packets(shard, offs, sizes, host_bytes, plan[:n], plan[n:])
        engine.h2d(dev_bytes[:total], host_bytes[:total])
        dev = engine.upload(slot, "plan", plan)
        return slot, Staged(dev_bytes[: max(total, 1)], dev[:n], dev[n:], n,
                            packet_bytes=int(total))


def _stats(verdicts: np.ndarray) -> DecodeStats:
    c = count(verdicts)
    return DecodeStats(packets=c["packets"], valid=c["valid"], dropped=c["corrupt"])


__all__ = ["CudaDecoder", "DeviceArray", "ResidentShard"]
