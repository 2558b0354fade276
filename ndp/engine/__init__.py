"""Decode engines: turning packet bytes into verdicts and tokens, on the host or a GPU. The CPU
reference every backend must equal bit for bit (``reference``), the per-backend primitives
the Loader drives chunk by chunk (``cpu``, ``cuda``), device memory, streams and DLPack
(``device``), backend choice (``backend``), ndp's bounded host threads (``threads``), what the
engines did, counted (``counters``), and the one-batch API ``ndp.Decoder`` on the same kernels
(``decoder``, ``cpu_decoder``, ``cuda_decoder``).

Imports the wire format, ``ndp.kernels`` and ``ndp.errors``; never storage or the Loader (the
kernels' host loops use ``threads`` in turn).
"""
