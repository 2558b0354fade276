"""GPU decode: packet bytes in, training arrays out, all on the device.

``CudaDecoder`` runs the kernels of ``ndp.kernels.{crc16,compact,build}_cuda`` and returns the
same batches as the CPU reference (``ndp.decode``), bit for bit, with arrays that stay on the
device and reach torch (or any DLPack consumer) without a copy.

Where the bytes come from:

* **host staging** (pass the shard as a NumPy/mmap array): the batch's packets are gathered into
  a pinned buffer (``ndp.kernels.stage``: a copy, no decoding) and moved by one asynchronous
  copy on a dedicated copy stream. Every ring slot has its own pinned and device staging
  buffers, so copying the next batch overlaps decoding this one;
* **device-resident** (``decoder.resident(shard)``): the shard is copied to the device once,
  within ``device_budget`` bytes, and each batch sends only its packet offsets.

The ring and how long a batch stays valid: output buffers are allocated once per ring slot
(``ring`` slots, 3 by default) and reused round-robin. A batch's arrays stay valid until
``ring`` further batches have been submitted to the same decoder. Work a consumer queued on a
stream that took the arrays through DLPack before that submit is ordered before the overwrite
(``ndp.device``); reading them later, or from the host without synchronising, is a bug. Copy
what must live longer (``tensor.clone()``).

Launches per batch: host staging is 3 copies (bytes, offsets, limits) then 3 kernels (validate,
compact, build) and one small copy of the counts back; packed mode adds the token scan and one
wait for the stream's length, which the host needs to cut windows. Launch configurations are
computed once per size and cached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ndp.backend import simulated
from ndp.decode import DecodeStats, PackedBatch, PaddedBatch, StreamExhausted
from ndp.device import (Buffer, DeviceArray, configure, device_memory_info, new_event,
                        new_stream, pinned)
from ndp.errors import ConfigError
from ndp.format import TYP_MASKED_TABLE, TYP_SKIP_TABLE, TYP_WIDTH_TABLE, DropReason
from ndp.kernels.crc16 import CRC16_TABLES
from ndp.packet import as_u8

_OK = int(DropReason.OK)


def _kernels():
    from ndp.kernels import build_cuda, compact_cuda, crc16_cuda

    return crc16_cuda, compact_cuda, build_cuda


def _grow(n: int) -> int:
    """Capacity for ``n`` items: the next power of two (at least 64), so sizes settle fast."""
    return max(64, 1 << max(0, (n - 1).bit_length()))


class ResidentShard:
    """A shard's bytes held in device memory; decode from it by passing it as ``source``."""

    def __init__(self, data: np.ndarray, buffer: Buffer, name: str) -> None:
        self.nbytes = int(data.shape[0])
        self.buffer = buffer
        self.name = name

    def __repr__(self) -> str:
        return f"ResidentShard({self.name!r}, {self.nbytes} bytes)"


class _Slot:
    """One ring slot: staging, scratch and output buffers, and the events that order them."""

    def __init__(self) -> None:
        self.caps: dict[str, Any] = {}
        self.host_bytes: np.ndarray | None = None
        self.dev_bytes: Buffer | None = None
        self.host_offsets: np.ndarray | None = None
        self.host_limits: np.ndarray | None = None
        self.sizes: np.ndarray | None = None
        self.offsets: Buffer | None = None
        self.limits: Buffer | None = None
        self.status: Buffer | None = None
        self.row_of_packet: Buffer | None = None
        self.rows: Buffer | None = None
        self.cum: Buffer | None = None
        self.counts: Buffer | None = None
        self.host_counts: np.ndarray | None = None
        self.outputs: dict[str, Buffer] = {}
        self.out_key: tuple[str, int] | None = None
        self.out_rows = 0
        self.use_limits = False
        self.staged = new_event()  # the H2D copies out of this slot's pinned buffers are done
        self.done = new_event()  # this slot's kernels and the counts copy are done
        self.used = False
        self.pending: _Pending | None = None


@dataclass
class _Pending:
    """A submitted batch: ``result()`` waits for its counts and returns the batch."""

    decoder: CudaDecoder
    slot: _Slot
    kind: str
    n_packets: int
    make: Any
    value: Any = None

    def result(self):
        if self.value is None:
            self.slot.done.synchronize()
            self.value = self.make(self.slot.host_counts.copy())
            self.slot.pending = None
        return self.value


class CudaDecoder:
    """Decode packets on the GPU (or Numba's simulator) into device-resident training arrays.

    ``ring``: output buffer sets reused round-robin (a batch stays valid for ``ring`` submits);
    ``device_budget``: the most bytes of device memory ``resident`` may use for shards (None:
    what the device has free, less a quarter kept for the training job).
    """

    backend = "cuda"

    def __init__(self, *, ring: int = 3, device_budget: int | None = None) -> None:
        if ring < 2:
            raise ConfigError(f"ring must be >= 2 so copy and compute can overlap, got {ring}")
        from numba import cuda

        self.ring = ring
        self.copy_stream = new_stream()
        self.compute_stream = new_stream()
        self._slots = [_Slot() for _ in range(ring)]
        self._next = 0
        self._tables = {
            "crc": cuda.to_device(CRC16_TABLES),
            "width": cuda.to_device(TYP_WIDTH_TABLE),
            "masked": cuda.to_device(TYP_MASKED_TABLE),
            "skip": cuda.to_device(TYP_SKIP_TABLE),
        }
        self._no_limits = cuda.device_array(0, dtype=np.int64)
        free, _ = device_memory_info()
        self.device_budget = device_budget if device_budget is not None else (free * 3) // 4
        self.resident_bytes = 0
        self._launch_cache: dict[tuple, Any] = {}
        # grids of at most 8 blocks per multiprocessor (1 block under the simulator)
        self._max_grid = 1 if simulated() else 8 * cuda.get_current_device().MULTIPROCESSOR_COUNT

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
        buffer = Buffer(max(need, 1), np.uint8)
        if need:
            buffer.kernel[:need].copy_to_device(data)
        self.resident_bytes += need
        return ResidentShard(data, buffer, name)

    # ---------------------------------------------------------------------------- the public
    def submit_padded(self, source: Any, offsets: Any, *, max_seq_length: int,
                      pad_token_id: int = 0) -> _Pending:
        """Queue a padded decode (see ``decode_padded``); ``.result()`` returns the batch."""
        if max_seq_length < 1:
            raise ConfigError(f"max_seq_length must be >= 1, got {max_seq_length}")
        offs = np.ascontiguousarray(offsets, dtype=np.int64).reshape(-1)
        n = int(offs.shape[0])
        slot, data = self._stage(source, offs)
        stream = self.compute_stream
        out = self._outputs(slot, "padded", (n, max_seq_length))
        crc16_cuda, compact_cuda, build_cuda = _kernels()
        if n:
            self._validate_and_compact(slot, data, n)
            self._launch(build_cuda.build_padded_cuda, n, 1, build_cuda.BUILD_BLOCK)(
                data, slot.offsets.kernel[:n], slot.rows.kernel, slot.counts.kernel,
                np.int64(pad_token_id), out["input_ids"].kernel, out["labels"].kernel,
                out["attention_mask"].kernel, out["lengths"].kernel,
                self._tables["width"], self._tables["masked"],
            )
        self._finish(slot, n)

        def make(counts: np.ndarray) -> PaddedBatch:
            rows = int(counts[_OK])
            stats = _stats(counts, n)
            stats.tokens = int(counts[build_cuda.TOKENS_SLOT])
            stats.truncated_tokens = int(counts[build_cuda.TRUNCATED_SLOT])
            return PaddedBatch(
                input_ids=out["input_ids"].view(stream, rows),
                labels=out["labels"].view(stream, rows),
                attention_mask=out["attention_mask"].view(stream, rows),
                lengths=out["lengths"].view(stream, rows),
                status=slot.status.view(stream, n),
                rows=slot.rows.view(stream, rows),
                stats=stats,
            )

        return self._pending(slot, "padded", n, make)

    def decode_padded(self, source: Any, offsets: Any, *, max_seq_length: int,
                      pad_token_id: int = 0) -> PaddedBatch:
        """As ``ndp.decode_padded``, on the device: one row per valid token packet, in packet
        order; arrays are ``DeviceArray`` views valid for ``ring`` further submits."""
        return self.submit_padded(source, offsets, max_seq_length=max_seq_length,
                                  pad_token_id=pad_token_id).result()

    def decode_packed(self, source: Any, offsets: Any, *, batch_size: int | None, seq_len: int,
                      start: int = 0) -> PackedBatch:
        """As ``ndp.decode_packed``, on the device. Waits once, for the stream's length."""
        if (batch_size is not None and batch_size < 1) or seq_len < 1:
            raise ConfigError(f"batch_size and seq_len must be >= 1, got {batch_size}, {seq_len}")
        offs = np.ascontiguousarray(offsets, dtype=np.int64).reshape(-1)
        n = int(offs.shape[0])
        slot, data = self._stage(source, offs)
        stream = self.compute_stream
        crc16_cuda, compact_cuda, build_cuda = _kernels()
        total = 0
        if n:
            self._validate_and_compact(slot, data, n)
            self._launch(compact_cuda.token_cum_cuda, 1, 1, compact_cuda.SCAN_BLOCK)(
                data, slot.offsets.kernel[:n], slot.rows.kernel, slot.counts.kernel,
                slot.cum.kernel, self._tables["width"], self._tables["masked"],
            )
            slot.counts.kernel.copy_to_host(slot.host_counts, stream=stream)
            stream.synchronize()
            total = int(slot.host_counts[build_cuda.STREAM_TOTAL_SLOT])
        counts = slot.host_counts.copy() if n else np.zeros(build_cuda.COUNT_SLOTS, np.int64)
        if batch_size is None:
            batch_size = max(0, (total - start - 1) // seq_len)
        need = start + batch_size * seq_len + 1
        if start < 0 or batch_size < 1 or need > total:
            self._finish(slot, n)
            status = slot.status.view(stream, n).copy_to_host() if n else np.zeros(0, np.uint8)
            raise StreamExhausted(
                f"windows from token {start} need {max(need, start + seq_len + 1)} tokens, "
                f"the valid packets hold {total}", stream_tokens=total, status=status,
            )
        out = self._outputs(slot, "packed", (batch_size, seq_len))
        positions = batch_size * seq_len + 1
        self._launch(build_cuda.build_packed_cuda, positions, build_cuda.BUILD_BLOCK,
                     build_cuda.BUILD_BLOCK)(
            data, slot.offsets.kernel[:n], slot.rows.kernel, slot.cum.kernel, slot.counts.kernel,
            np.int64(start), out["x"].kernel[:batch_size], out["y"].kernel[:batch_size],
            self._tables["width"], self._tables["masked"],
        )
        self._finish(slot, n, copy_counts=False)
        stats = _stats(counts, n)
        stats.tokens = batch_size * seq_len
        return PackedBatch(
            x=out["x"].view(stream, batch_size), y=out["y"].view(stream, batch_size), start=start,
            next_start=start + batch_size * seq_len, stream_tokens=total,
            status=slot.status.view(stream, n), stats=stats,
        )

    def synchronize(self) -> None:
        """Wait for everything queued so far."""
        self.copy_stream.synchronize()
        self.compute_stream.synchronize()

    # ----------------------------------------------------------------------------- internals
    def _take_slot(self) -> _Slot:
        slot = self._slots[self._next]
        self._next = (self._next + 1) % self.ring
        if slot.pending is not None:  # its counts are about to be overwritten: read them now
            slot.pending.result()
        if slot.used:
            slot.staged.synchronize()  # the host may now overwrite its pinned buffers
            slot.done.wait(self.copy_stream)  # device staging buffers are free again
        slot.used = True
        return slot

    def _ensure(self, slot: _Slot, name: str, n: int, dtype: Any, *, host: bool = False,
                device: bool = True) -> None:
        """Grow ``slot``'s scratch array ``name`` to hold ``n`` items (reallocation only after
        the slot's previous work is done, so no kernel still uses the old memory)."""
        if slot.caps.get(name, -1) >= n:
            return
        slot.done.synchronize()
        cap = _grow(n)
        if device:
            setattr(slot, name, Buffer(cap, dtype))
        if host:
            setattr(slot, "host_" + name, pinned(cap, dtype))
        slot.caps[name] = cap

    def _stage(self, source: Any, offsets: np.ndarray) -> tuple[_Slot, Any]:
        """Put the batch's bytes and offsets on the device (in a fresh ring slot); returns the
        slot and the device byte array the kernels read."""
        from ndp.kernels.stage import gather_packets, staged_size

        slot = self._take_slot()
        n = int(offsets.shape[0])
        _, _, build_cuda = _kernels()
        for name, dtype in (("status", np.uint8), ("row_of_packet", np.int64),
                            ("rows", np.int64)):
            self._ensure(slot, name, n, dtype)
        self._ensure(slot, "offsets", n, np.int64, host=True)
        self._ensure(slot, "cum", n + 1, np.int64)
        if slot.counts is None:
            slot.counts = Buffer(build_cuda.COUNT_SLOTS, np.int64)
            slot.host_counts = pinned(build_cuda.COUNT_SLOTS, np.int64)
            slot.host_counts[:] = 0
        copy = self.copy_stream
        if isinstance(source, ResidentShard):
            slot.host_offsets[:n] = offsets
            if n:
                slot.offsets.kernel[:n].copy_to_device(slot.host_offsets[:n], stream=copy)
            slot.use_limits = False
            data = source.buffer.kernel[: max(source.nbytes, 1)]
        else:
            shard = as_u8(source)
            self._ensure(slot, "limits", n, np.int64, host=True)
            if slot.sizes is None or slot.sizes.shape[0] < n:
                slot.sizes = np.empty(_grow(n), np.int64)
            total = staged_size(shard, offsets, slot.sizes[:n])
            self._ensure(slot, "bytes", max(total, 1), np.uint8, host=True, device=False)
            if slot.caps.get("dev_bytes", -1) < slot.caps["bytes"]:
                slot.dev_bytes = Buffer(slot.caps["bytes"], np.uint8)
                slot.caps["dev_bytes"] = slot.caps["bytes"]
            gather_packets(shard, offsets, slot.sizes[:n], slot.host_bytes,
                           slot.host_offsets[:n], slot.host_limits[:n])
            if total:
                slot.dev_bytes.kernel[:total].copy_to_device(slot.host_bytes[:total], stream=copy)
            if n:
                slot.offsets.kernel[:n].copy_to_device(slot.host_offsets[:n], stream=copy)
                slot.limits.kernel[:n].copy_to_device(slot.host_limits[:n], stream=copy)
            slot.use_limits = True
            data = slot.dev_bytes.kernel[: max(total, 1)]
        slot.staged.record(copy)
        slot.staged.wait(self.compute_stream)
        # every buffer of the slot that was handed out is about to be written again
        for buffer in (slot.status, slot.rows, *slot.outputs.values()):
            buffer.consumers.fence(self.compute_stream)
        return slot, data

    def _outputs(self, slot: _Slot, kind: str, shape: tuple[int, int]) -> dict[str, Buffer]:
        """The slot's output buffers, (re)allocated for ``shape`` when too small or of another
        kind. Old buffers a consumer still holds stay alive through its DLPack reference."""
        key = (kind, shape[1])
        if slot.out_key != key or slot.out_rows < shape[0]:
            slot.done.synchronize()
            rows = _grow(shape[0])
            names = ("input_ids", "labels", "attention_mask") if kind == "padded" else ("x", "y")
            slot.outputs = {name: Buffer((rows, shape[1]), np.int64) for name in names}
            if kind == "padded":
                slot.outputs["lengths"] = Buffer(rows, np.int64)
            slot.out_key, slot.out_rows = key, rows
        return slot.outputs

    def _validate_and_compact(self, slot: _Slot, data: Any, n: int) -> None:
        crc16_cuda, compact_cuda, _ = _kernels()
        limits = slot.limits.kernel[:n] if slot.use_limits else self._no_limits
        self._launch(crc16_cuda.validate_packets_cuda, n, crc16_cuda.VALIDATE_BLOCK,
                     crc16_cuda.VALIDATE_BLOCK)(
            data, slot.offsets.kernel[:n], limits, slot.status.kernel[:n],
            self._tables["crc"], self._tables["width"], self._tables["masked"],
            self._tables["skip"],
        )
        self._launch(compact_cuda.compact_cuda, 1, 1, compact_cuda.SCAN_BLOCK)(
            slot.status.kernel[:n], slot.row_of_packet.kernel[:n], slot.rows.kernel[:n],
            slot.counts.kernel,
        )

    def _finish(self, slot: _Slot, n: int, *, copy_counts: bool = True) -> None:
        stream = self.compute_stream
        if copy_counts and n:
            slot.counts.kernel.copy_to_host(slot.host_counts, stream=stream)
        elif copy_counts:
            slot.host_counts[:] = 0
        slot.done.record(stream)

    def _pending(self, slot: _Slot, kind: str, n: int, make: Any) -> _Pending:
        pending = _Pending(self, slot, kind, n, make)
        slot.pending = pending
        return pending

    def _launch(self, kernel: Any, items: int, per_block: int, block: int) -> Any:
        """``kernel`` configured for ``items`` units of work (``per_block`` per block) on the
        compute stream: enough blocks to fill the device a few times over, never more than the
        work (grid-stride loops cover the rest). Configured launchers are cached, so a steady
        loop of equal-sized batches builds no launch configuration after the first."""
        grid = max(1, min(math.ceil(items / per_block), self._max_grid))
        key = (kernel, grid, block)
        launcher = self._launch_cache.get(key)
        if launcher is None:
            launcher = self._launch_cache[key] = configure(kernel, grid, block,
                                                           self.compute_stream)
        return launcher


def _stats(counts: np.ndarray, n: int) -> DecodeStats:
    dropped = {
        DropReason(code).name: int(counts[code])
        for code in range(len(DropReason))
        if code != _OK and counts[code]
    }
    return DecodeStats(packets=n, valid=int(counts[_OK]), dropped=dropped)


__all__ = ["CudaDecoder", "DeviceArray", "ResidentShard"]
