"""CRC-16 by carry-less multiplication on x86-64 (PCLMULQDQ): the host's loop for long packets.

A table-driven CRC is bounded by its lookups (slice-by-16: about 1.8 GB/s on one core of the
CI machine, see ``crc16.py``). Carry-less multiplication folds 16 bytes at a time instead, as zlib and the Linux
kernel do for their CRCs ("Fast CRC Computation for Generic Polynomials Using PCLMULQDQ",
Intel, 2009), here for the 16-bit non-reflected CRC-16/CCITT-FALSE:

* The bytes of a range, read big-endian, are a polynomial ``M``; its CRC from state 0 is
  ``M * x^16 mod P`` (P = x^16 + ``CRC16_POLY``). A starting state ``s`` is the same as
  ``s`` XORed into the first two bytes.
* A 128-bit block ``A = H * x^64 + L`` moved ``D`` bits further along the message is
  congruent to ``H * (x^(D+64) mod P) + L * (x^D mod P)``: two 64x16-bit carry-less products,
  at most 79 bits. XORing the block found ``D`` bits on keeps the sum congruent, so a long
  range folds into 128 bits with two multiplications per 16 bytes.
* Four accumulators fold 64-byte strides (D = 512) so their multiplications overlap; they
  join with 16-byte folds (D = 128), as do the last whole blocks; the last 128 bits go through
  the slice-by-16 tables from state 0 (a 16-byte step of the table loop is exactly this
  product), and the tail of fewer than 16 bytes through the table loop.

On one thread of the 2-core CI machine the host loop built on ``crc16_update_clmul`` runs
4.2-4.8x the slice-by-16 loop over ranges of 2-8 KB and 1.5x at 128 bytes; below 128 bytes
``crc16.crc16_update_host`` keeps the table loop (``python benchmarks/cpu/bench_cpu.py --only
crc``). It compiles only where the CPU has PCLMULQDQ and Numba targets the host
(``HAS_CLMUL``); elsewhere (ARM hosts, ``NUMBA_CPU_NAME`` set for a portable cache,
``NUMBA_DISABLE_JIT``) nothing here is compiled and the table loop serves every range.
"""

from __future__ import annotations

import platform

import llvmlite.binding as llb
import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ndp.wire.format import CRC16_POLY
from ndp.kernels._jit import cpu_kernel


def _host_has_pclmul() -> bool:
    """Whether the code Numba compiles here may use PCLMULQDQ (else the table loop serves)."""
    if numba.config.DISABLE_JIT or platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    if numba.config.CPU_NAME is not None:  # a chosen target (portable cache): maybe no pclmul
        return "+pclmul" in (numba.config.CPU_FEATURES or "")
    try:
        return bool(llb.get_host_cpu_features().get("pclmul", False))
    except RuntimeError:  # LLVM cannot read this host's features: assume none
        return False


#: whether ``crc16_update_clmul`` can run here (x86-64 with PCLMULQDQ, Numba targeting the host)
HAS_CLMUL = _host_has_pclmul()


def x_pow_mod(n: int, poly: int = CRC16_POLY) -> int:
    """``x^n mod (x^16 + poly)`` as a 16-bit integer."""
    r = 1
    for _ in range(n):
        r <<= 1
        if r & 0x10000:
            r ^= 0x10000 | poly
    return r


# fold constants: (x^(D+64) mod P, x^D mod P) for D = 512 (64-byte strides) and D = 128
_K512_HI = np.uint64(x_pow_mod(576))
_K512_LO = np.uint64(x_pow_mod(512))
_K128_HI = np.uint64(x_pow_mod(192))
_K128_LO = np.uint64(x_pow_mod(128))
#: fewest bytes ``crc16_update_clmul`` accepts (one 64-byte stride of its four accumulators)
CLMUL_MIN_BYTES = 64


@intrinsic
def clmul(typingctx, a, b):  # pragma: no cover - compiled
    """Carry-less product of two uint64 as (low 64 bits, high 64 bits)."""
    if a != types.uint64 or b != types.uint64:
        return None
    sig = types.UniTuple(types.uint64, 2)(types.uint64, types.uint64)

    def codegen(context, builder, signature, args):
        v2 = ir.VectorType(ir.IntType(64), 2)
        fnty = ir.FunctionType(v2, [v2, v2, ir.IntType(8)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.pclmulqdq")
        zero = ir.Constant(ir.IntType(32), 0)
        va = builder.insert_element(ir.Constant(v2, None), args[0], zero)
        vb = builder.insert_element(ir.Constant(v2, None), args[1], zero)
        prod = builder.call(fn, [va, vb, ir.Constant(ir.IntType(8), 0)])
        lo = builder.extract_element(prod, zero)
        hi = builder.extract_element(prod, ir.Constant(ir.IntType(32), 1))
        return cgutils.pack_array(builder, [lo, hi])

    return sig, codegen


@intrinsic
def load_be64(typingctx, buf, idx):  # pragma: no cover - compiled
    """The 8 bytes ``buf[idx:idx + 8]`` of a 1-D uint8 array as a big-endian uint64: one
    unaligned load and a byte swap where ``buf`` is contiguous, 8 strided loads otherwise.
    The caller keeps ``idx + 8`` in bounds."""
    if not (isinstance(buf, types.Array) and buf.dtype == types.uint8 and buf.ndim == 1):
        return None
    sig = types.uint64(buf, idx)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        arr = context.make_array(aryty)(context, builder, args[0])
        index = context.cast(builder, args[1], signature.args[1], types.intp)
        i64 = ir.IntType(64)
        if aryty.layout == "C":
            ptr = builder.gep(arr.data, [index])
            return builder.bswap(builder.load(builder.bitcast(ptr, i64.as_pointer()), align=1))
        word = ir.Constant(i64, 0)
        for j in range(8):
            at = builder.add(index, ir.Constant(index.type, j))
            ptr = cgutils.get_item_pointer(context, builder, aryty, arr, [at])
            byte = builder.zext(builder.load(ptr), i64)
            word = builder.or_(word, builder.shl(byte, ir.Constant(i64, 56 - 8 * j)))
        return word

    return sig, codegen


@cpu_kernel
def _fold(h, l, k_hi, k_lo):  # pragma: no cover - compiled
    """(h, l) * x^D reduced to at most 79 bits, as (high, low) 64-bit halves."""
    a_lo, a_hi = clmul(h, k_hi)
    b_lo, b_hi = clmul(l, k_lo)
    return a_hi ^ b_hi, a_lo ^ b_lo


@cpu_kernel
def crc16_update_clmul(crc, buf, start, stop, tables):  # pragma: no cover - compiled
    """CRC-16 state ``crc`` advanced over ``buf[start:stop]``; needs ``stop - start >=
    CLMUL_MIN_BYTES``. Returns the state after the last whole
    16-byte block and the position of the tail that the table loop finishes."""
    eight = np.uint64(8)
    i = np.uint64(start)
    stop = np.uint64(stop)
    # four accumulators over the first 64 bytes; the state joins the first two bytes
    h0 = load_be64(buf, i) ^ (np.uint64(crc) << np.uint64(48))
    l0 = load_be64(buf, i + eight)
    h1 = load_be64(buf, i + np.uint64(16))
    l1 = load_be64(buf, i + np.uint64(24))
    h2 = load_be64(buf, i + np.uint64(32))
    l2 = load_be64(buf, i + np.uint64(40))
    h3 = load_be64(buf, i + np.uint64(48))
    l3 = load_be64(buf, i + np.uint64(56))
    i += np.uint64(64)
    while i + np.uint64(64) <= stop:
        fh, fl = _fold(h0, l0, _K512_HI, _K512_LO)
        h0 = fh ^ load_be64(buf, i)
        l0 = fl ^ load_be64(buf, i + eight)
        fh, fl = _fold(h1, l1, _K512_HI, _K512_LO)
        h1 = fh ^ load_be64(buf, i + np.uint64(16))
        l1 = fl ^ load_be64(buf, i + np.uint64(24))
        fh, fl = _fold(h2, l2, _K512_HI, _K512_LO)
        h2 = fh ^ load_be64(buf, i + np.uint64(32))
        l2 = fl ^ load_be64(buf, i + np.uint64(40))
        fh, fl = _fold(h3, l3, _K512_HI, _K512_LO)
        h3 = fh ^ load_be64(buf, i + np.uint64(48))
        l3 = fl ^ load_be64(buf, i + np.uint64(56))
        i += np.uint64(64)
    # join the accumulators, then the remaining whole 16-byte blocks
    fh, fl = _fold(h0, l0, _K128_HI, _K128_LO)
    h, l = fh ^ h1, fl ^ l1
    fh, fl = _fold(h, l, _K128_HI, _K128_LO)
    h, l = fh ^ h2, fl ^ l2
    fh, fl = _fold(h, l, _K128_HI, _K128_LO)
    h, l = fh ^ h3, fl ^ l3
    while i + np.uint64(16) <= stop:
        fh, fl = _fold(h, l, _K128_HI, _K128_LO)
        h = fh ^ load_be64(buf, i)
        l = fl ^ load_be64(buf, i + eight)
        i += np.uint64(16)
    # (h, l) * x^16 mod P: one 16-byte step of the table loop from state 0
    out = np.uint32(0)
    for j in range(8):
        shift = np.uint64(56 - 8 * j)
        out ^= tables[15 - j, (h >> shift) & np.uint64(0xFF)]
        out ^= tables[7 - j, (l >> shift) & np.uint64(0xFF)]
    return out, i
