"""Device-side kernel families, installed as ``ndp.kernels``.

One file per family; each holds the CPU reference (a serial Numba function over a range of
items, run on ndp's host threads) that the CUDA kernel beside it must equal bit for bit:
``verdict`` (per packet: its token count, or why it is dropped), ``crc16`` (CRC-16 and the
checks a verdict is made of), ``build`` (token decode into padded rows, packed windows or
packed rows). ``compact`` (valid packets to rows) and ``stage`` (packets gathered into one
buffer, shards copied into pinned memory) are host-only.
"""

#: the modules with CUDA kernels; each has ``SIGNATURES`` (what the host launches)
CUDA_MODULES = ("ndp.kernels.crc16_cuda", "ndp.kernels.verdict_cuda", "ndp.kernels.build_cuda")
