"""The decode primitives of a backend, on the buffers of a ring slot: verdicts, and the padded,
packed and packing builds (``ndp.kernels``). ``CpuEngine`` runs the CPU kernels on host arrays;
``ndp.engine.cuda.CudaEngine`` launches the CUDA kernels on its streams. Both have the same methods
and write the same values, so everything around them (``ndp.loader.layouts.layout``,
``ndp.loader.pipeline.chunks``,
``ndp.loader.pipeline.serve``) is backend-agnostic.

A ``Slot`` holds one chunk's buffers: scratch (the packets' offsets, their verdicts, the build
plan) and outputs, each allocated once and grown by powers of two, so a steady loop allocates
nothing. ``Slot.generation`` changes whenever an output is reallocated, so whoever wrapped the
outputs (``ndp.loader.pipeline.serve``) knows to wrap them again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ndp.engine.counters import Counters
from ndp.errors import ConfigError
from ndp.wire.format import DropReason
from ndp.kernels.build import (build_documents_cpu, build_packed_cpu, build_packing_cpu,
                               build_padded_cpu)
from ndp.kernels.verdict import verdicts_cpu

#: a ``vocab`` no id reaches (ids are at most 32 bits): no range check
NO_LIMIT = 1 << 32
#: packed windows at ``start + b*T`` (no window's own start: ``ndp.loader.layouts.align``)
NO_WINS = np.zeros(0, np.int64)

#: the outputs of each mode, (name, dtype); "cu_seqlens" is 1-D, the others (rows, columns)
OUTPUTS = {
    "padded": (("input_ids", np.int64), ("labels", np.int64), ("attention_mask", np.int64)),
    "packed": (("x", np.int64), ("y", np.int64)),
    "packing": (("input_ids", np.int64), ("labels", np.int64), ("attention_mask", np.int64),
                ("position_ids", np.int64), ("cu_seqlens", np.int32)),
    # packed windows with their documents' boundaries (``documents=True``)
    "packed+documents": (("x", np.int64), ("y", np.int64), ("position_ids", np.int64),
                         ("document_ids", np.int32), ("cu_seqlens", np.int32)),
}


def grow(n: int) -> int:
    """Capacity for ``n`` items: the next power of two (at least 64), so sizes settle fast."""
    return max(64, 1 << max(0, (n - 1).bit_length()))


class TooManyShards(ConfigError):
    """A chunk needs more shards on the device at once than its staging area holds."""


@dataclass
class Staged:
    """A chunk's packets where the kernels can read them: the byte buffer, each packet's offset
    in it and where its shard ends (``limits``; empty: the buffer is one shard)."""

    data: Any
    offsets: Any
    limits: Any
    n: int
    shards: tuple[int, ...] = ()  # corpus shards it reads (device arena bookkeeping)
    #: bytes of its packets, frames included, where known (0: not known); a GPU gives long
    #: packets several threads each by their mean (``verdict_cuda.lanes_for``)
    packet_bytes: int = 0


@dataclass
class Slot:
    """One ring slot's buffers (see the module docstring) and, on a GPU, its events."""

    index: int
    scratch: dict[str, tuple[Any, Any, int]] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)  # views of ``flat``, in rows
    flat: dict[str, Any] = field(default_factory=dict)  # each output's memory, 1-D
    out_key: tuple = ()
    out_caps: tuple[int, int] = (0, 0)
    generation: int = 0
    ready: Any = None  # recorded after the chunk's kernels (GPU)
    released: Any = None  # recorded on the consumer's stream when it is done with the chunk
    released_recorded: bool = False
    judged: Any = None  # recorded after the copy of the chunk's verdicts to the host (GPU)


class CpuEngine:
    """Decode primitives on the host's cores (``ndp.engine.threads``)."""

    backend = "cpu"
    #: whether work is queued on streams that a consumer must be ordered after
    has_streams = False

    #: the GPU this engine works on (``None``: the host)
    device: int | None = None

    def __init__(self, counters: Counters | None = None) -> None:
        self.counters = counters if counters is not None else Counters()

    def activated(self) -> Any:
        """A context in which this engine's device is current (nothing on the host)."""
        import contextlib

        return contextlib.nullcontext()

    def enter_thread(self) -> None:
        """Make this engine's device current for good in a thread ndp started (nothing on the
        host)."""

    # ------------------------------------------------------------------------------- buffers
    def scratch(self, slot: Slot, name: str, n: int, dtype: Any) -> tuple[Any, np.ndarray]:
        """(kernel array, host array) of at least ``n`` items; one array on the CPU."""
        have = slot.scratch.get(name)
        if have is None or have[2] < n:
            cap = grow(n)
            array = self._host(cap, dtype)
            have = slot.scratch[name] = (self._device(cap, dtype, like=array), array, cap)
        return have[0], have[1]

    def outputs(self, slot: Slot, mode: str, rows: int, cols: int, extra: int = 0,
                least: int = 0) -> dict:
        """The slot's output buffers for ``rows`` x ``cols`` of ``mode`` (and ``extra`` items of
        the 1-D ``cu_seqlens``). Each 2-D output is a view of a flat buffer of at least
        ``least`` elements (a schedule's largest chunk, ``ndp.loader.planning.shapes``), reallocated
        only when it is too small: another ``cols`` that fits is the same memory seen in rows
        of ``cols``, allocating nothing. Claims them for writing first (``claim``)."""
        self.claim(slot)
        fresh = slot.out_key[:1] != (mode,)
        elements = max(rows * cols, least)
        more_rows = fresh or slot.out_caps[0] < elements
        more_extra = fresh or slot.out_caps[1] < extra
        if more_rows or more_extra:
            self.synchronize_slot(slot)
            if fresh:
                slot.flat = {}
            caps = (grow(max(elements, 1)) if more_rows else slot.out_caps[0],
                    grow(max(extra, 1)) if more_extra else slot.out_caps[1])
            for name, dtype in OUTPUTS[mode]:
                flat = name == "cu_seqlens"
                if more_extra if flat else more_rows:
                    slot.flat[name] = self._output((caps[1] if flat else caps[0],), dtype)
            slot.out_caps = caps
            slot.out_key = ()
            slot.generation += 1
        if slot.out_key != (mode, cols):
            slot.outputs = {name: buf if name == "cu_seqlens" else
                            self._shaped(buf, slot.out_caps[0] // cols, cols)
                            for name, buf in slot.flat.items()}
            slot.out_key = (mode, cols)
        return slot.outputs

    def _shaped(self, flat: Any, rows: int, cols: int) -> Any:
        """The first ``rows * cols`` elements of a flat output as ``rows`` rows of ``cols``."""
        return flat[: rows * cols].reshape(rows, cols)

    def _host(self, n: int, dtype: Any) -> np.ndarray:
        return np.empty(n, dtype)

    def _device(self, n: int, dtype: Any, like: np.ndarray) -> Any:
        return like

    def _output(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return np.empty(shape, dtype)


    # ------------------------------------------------------------------------------- kernels
    def submit_verdicts(self, staged: Staged, slot: Slot, vocab: int) -> None:
        """Start computing each staged packet's verdict (``ndp.kernels.verdict``; ids must be
        below ``vocab``); on the CPU this is the whole computation."""
        _, out = self.scratch(slot, "verdicts", staged.n, np.int64)
        self.counters.launches += 1
        verdicts_cpu(staged.data, staged.offsets, staged.limits, out[:staged.n], vocab)

    def read_verdicts(self, slot: Slot, n: int) -> np.ndarray:
        """The verdicts ``submit_verdicts`` computed, on the host."""
        return slot.scratch["verdicts"][1][:n]

    def format_verdicts(self, staged: Staged, slot: Slot) -> np.ndarray:
        """Each staged packet's verdict by the format alone, on the host (submit, then read):
        what ``ndp.engine.reference`` delivers, so a token packet with no tokens or with any ids is
        valid (the Loader drops those a model cannot take, ``submit_verdicts``' ``vocab``)."""
        self.submit_verdicts(staged, slot, NO_LIMIT)
        verdicts = self.read_verdicts(slot, staged.n)
        verdicts[verdicts == -DropReason.EMPTY] = 0
        return verdicts

    def upload(self, slot: Slot, name: str, values: np.ndarray) -> Any:
        """``values`` where the kernels read them (the CPU reads host memory as it is)."""
        return values

    def build_padded(self, staged: Staged, slot: Slot, row_packet: np.ndarray, pad_id: int,
                     outs: dict) -> None:
        self.counters.launches += 1
        build_padded_cpu(staged.data, staged.offsets, self.upload(slot, "rows", row_packet),
                         pad_id, outs["input_ids"], outs["labels"], outs["attention_mask"])

    def build_packed(self, staged: Staged, slot: Slot, rows: np.ndarray, cum: np.ndarray,
                     start: int, windows: int, outs: dict, wins: np.ndarray = NO_WINS) -> None:
        """Packed windows from stream position ``start`` on, or each from ``wins``' (where
        given: windows aligned to documents, ``ndp.loader.layouts.align``)."""
        self.counters.launches += 1
        build_packed_cpu(staged.data, staged.offsets, rows, cum, start, wins,
                         outs["x"][:windows], outs["y"][:windows])

    def build_documents(self, slot: Slot, doc_cum: np.ndarray, start: int, windows: int,
                        cu: np.ndarray, outs: dict, wins: np.ndarray = NO_WINS) -> None:
        """Packed windows' ``position_ids``, ``document_ids`` and ``cu_seqlens``
        (``documents=True``): from the documents' stream starts ``doc_cum``."""
        self.counters.launches += 1
        build_documents_cpu(doc_cum, start, wins, outs["position_ids"][:windows],
                            outs["document_ids"][:windows])
        outs["cu_seqlens"][:cu.shape[0]] = cu

    def build_packing(self, staged: Staged, slot: Slot, plan: dict, pad_id: int,
                      outs: dict) -> None:
        self.counters.launches += 1
        build_packing_cpu(staged.data, staged.offsets, plan["doc_packet"], plan["doc_col"],
                          plan["doc_len"], plan["row_docs"], pad_id, outs["input_ids"],
                          outs["labels"], outs["attention_mask"], outs["position_ids"])
        cu = plan["cu_seqlens"]
        outs["cu_seqlens"][:cu.shape[0]] = cu

    # ------------------------------------------------------------------------ slot ordering
    def acquire(self, slot: Slot) -> None:
        """Before a slot is used for a new chunk."""

    def claim(self, slot: Slot) -> None:
        """Before the slot's outputs are written again (``outputs``): the consumer's work on
        its previous chunk comes first (nothing on the host: that work is done)."""

    def finish(self, slot: Slot) -> None:
        """After a chunk's kernels were queued into ``slot``."""

    def synchronize_slot(self, slot: Slot) -> None:
        """Wait until the slot's queued work is done (before its memory is reallocated)."""

    def synchronize(self) -> None:
        """Wait for everything queued (nothing: CPU work is synchronous)."""

    def consumer_wait(self, slot: Slot, handle: int | None) -> None:
        """Order the consumer's stream after the slot's chunk (nothing to order on the CPU)."""

    def release(self, slot: Slot, handle: int | None) -> None:
        """The consumer is done with the slot's chunk (nothing to record on the CPU)."""
