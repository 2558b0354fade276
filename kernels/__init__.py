"""Device-side kernel families, installed as ``ndp.kernels``.

One file per family; each holds the CPU reference (Numba ``njit``) that every other backend must
equal bit for bit: ``crc16`` (CRC-16 and per-packet validation), ``compact`` (valid packets to
output rows) and ``build`` (token decode into padded rows or packed windows).
"""
