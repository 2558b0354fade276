"""The lanes' CRC (``kernels/crc16_lanes.py``) against the table loop and ``binascii``: any
range, any starting state, any number of lanes (a lane with no chunk, a range shorter than a
chunk, lanes that are not a power of two)."""

from __future__ import annotations

import binascii

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ndp.kernels.crc16 import CRC16_TABLES, crc16_update
from ndp.kernels.crc16_lanes import crc16_by_lanes, mulmod16, xpow8


@given(st.binary(max_size=700), st.integers(0, 9), st.integers(0, 0xFFFF),
       st.sampled_from([1, 2, 3, 4, 7, 8, 16, 32]))
def test_lanes_give_the_table_loops_state(payload, start, init, lanes):
    buf = np.frombuffer(bytes(start) + payload + b"\x5a" * 3, np.uint8)
    stop = start + len(payload)
    want = crc16_update(np.uint32(init), buf, start, stop, CRC16_TABLES)
    assert crc16_by_lanes(np.uint32(init), buf, start, stop, CRC16_TABLES, lanes) == want
    if init == 0xFFFF:
        assert want == binascii.crc_hqx(payload, 0xFFFF)


def test_a_state_across_zero_bytes_is_a_product_mod_p():
    """What the lanes' joins rest on: n zero bytes multiply a state by x^(8n) mod P."""
    zeros = np.zeros(300, np.uint8)
    for state in (1, 0x1234, 0xFFFF):
        for n in (0, 1, 7, 8, 255, 300):
            moved = crc16_update(np.uint32(state), zeros, 0, n, CRC16_TABLES)
            assert mulmod16(np.uint32(state), xpow8(n)) == moved
