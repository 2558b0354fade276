"""What a decoder did, counted: the work whose fixed cost per call made the GPU path slow.

Every kernel launch, copy between host and device, host wait and DLPack export of the decode
path goes through a ``Counters``; tests pin the counts per batch (no clock needed, so they cannot
be flaky), and benchmarks print them beside the timings.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class Counters:
    """Running totals of one decoder (``loader.counters``)."""

    chunks: int = 0  # decode calls (a Loader decodes a chunk of batches per call)
    batches: int = 0  # batches those calls made
    launches: int = 0  # kernel launches (CPU: kernel calls)
    h2d_copies: int = 0  # host-to-device copies
    h2d_bytes: int = 0
    d2h_copies: int = 0  # device-to-host copies
    d2h_bytes: int = 0
    host_waits: int = 0  # the host blocked until device work finished
    dlpack_exports: int = 0  # arrays handed to a DLPack consumer
    shard_copies: int = 0  # whole shards (or ranges of them) copied to the device
    events_created: int = 0  # CUDA events made (a steady loop reuses its own: none per chunk)
    #: chunks whose batches the consumer still referenced when their ring slot came round
    #: again: their buffers were left to it and new ones allocated (``ndp.loader.pipeline.serve``)
    held_chunks: int = 0
    #: chunks staged, their verdicts queued, before the chunk ahead of them was laid out (two
    #: chunks in flight, ``ndp.loader.pipeline.ahead``), and of those the ones not used: the chunk
    #: before ended elsewhere than the index said (its dropped packets moved it), or ended
    #: the epoch
    staged_ahead: int = 0
    ahead_dropped: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def per_batch(self) -> dict[str, float]:
        """Every count divided by the batches made (0 before the first)."""
        n = max(self.batches, 1)
        return {k: v / n for k, v in asdict(self).items() if k != "batches"}

    def since(self, earlier: dict[str, int]) -> dict[str, int]:
        """The counts since ``earlier`` (an ``as_dict()``)."""
        return {k: v - earlier.get(k, 0) for k, v in asdict(self).items()}
