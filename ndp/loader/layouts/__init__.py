"""Batch layout: how a chunk's verdicts become batches, on the host, as arrays.

``layout`` (padded, packed and packing layouts of a chunk), ``packing`` and ``packing_chunk``
(sequence
packing, compiled), ``documents`` (document boundaries in packed windows), ``align`` (packed windows
at
documents) and ``truncation`` (what padded rows cut). No thread, no device: pure functions of the
verdicts and the index.
"""
