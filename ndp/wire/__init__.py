"""The wire format: what an NDP packet and shard are, byte by byte (``format``, the one place
they are specified), and encoding and decoding single packets on the host (``packet``).

Imports nothing of ndp's but ``ndp.errors`` and the CRC kernels; every other layer imports it.
"""
