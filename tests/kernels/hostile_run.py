"""Feed the CUDA decoder hostile input, for ``compute-sanitizer --tool memcheck``.

Every drop reason, offsets far outside the shard (negative, past its end, near 2**63), a LEN
that runs past the end, random corruption of a valid shard, and a truncated shard, through host
staging and device-resident decoding, padded and packed. Each batch is also compared with the
CPU decoder. Run on a GPU machine:

    compute-sanitizer --tool memcheck --error-exitcode 9 python tests/kernels/hostile_run.py

A clean run prints "hostile run: N batches equal to the CPU" and the sanitizer reports 0 errors.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for conftest's helpers

import conftest as helpers  # noqa: E402

from ndp.engine.reference import StreamExhausted  # noqa: E402
from ndp.engine.decoder import CpuDecoder  # noqa: E402
from ndp.engine.cuda_decoder import CudaDecoder  # noqa: E402


def host(array) -> np.ndarray:
    return array if isinstance(array, np.ndarray) else array.copy_to_host()


def main() -> int:
    rng = np.random.default_rng(1234)
    dec, cpu = CudaDecoder(ring=2), CpuDecoder(ring=2)
    data, offsets, _ = helpers.drop_case()
    cases = [(np.frombuffer(data, np.uint8), offsets)]
    base = helpers.base_stream()
    for _ in range(40):
        raw = bytearray(base.data)
        for _ in range(int(rng.integers(1, 6))):
            raw[int(rng.integers(0, len(raw)))] = int(rng.integers(0, 256))
        cut = int(rng.integers(len(raw) // 2, len(raw) + 1))
        hostile = rng.integers(-(2**62), 2**62, size=4).tolist() + [len(raw) - 1, 2**63 - 1]
        cases.append((np.frombuffer(bytes(raw[:cut]), np.uint8), list(base.offsets) + hostile))
    checked = 0
    for shard, offs in cases:
        for source in (shard, dec.resident(shard)):
            for max_len in (1, 33):
                got = dec.decode_padded(source, offs, seq_len=max_len)
                want = cpu.decode_padded(shard, offs, seq_len=max_len)
                for name in ("input_ids", "labels", "attention_mask", "status", "rows"):
                    if not np.array_equal(host(getattr(got, name)), getattr(want, name)):
                        print(f"MISMATCH in {name}")
                        return 1
                checked += 1
            try:
                want = cpu.decode_packed(shard, offs, batch_size=None, seq_len=7)
            except StreamExhausted:
                continue
            got = dec.decode_packed(source, offs, batch_size=None, seq_len=7)
            if not (np.array_equal(got.x.copy_to_host(), want.x)
                    and np.array_equal(got.y.copy_to_host(), want.y)):
                print("MISMATCH in packed windows")
                return 1
            checked += 1
        for lanes in (4, 32):  # long packets' verdicts, several threads a packet
            if not np.array_equal(lanes_verdicts(shard, offs, lanes), cpu_verdicts(shard, offs)):
                print(f"MISMATCH in the verdicts of {lanes} lanes")
                return 1
            checked += 1
    dec.synchronize()
    print(f"hostile run: {checked} batches equal to the CPU")
    return 0


def lanes_verdicts(shard: np.ndarray, offs: list, lanes: int) -> np.ndarray:
    """``verdicts_lanes_cuda`` launched as the engine launches it (blocks of LANES_BLOCK
    threads; one under the simulator, where it is slow), over the whole shard."""
    from numba import cuda

    from ndp.engine.backend import simulated
    from ndp.kernels import verdict_cuda
    from ndp.kernels.crc16 import CRC16_TABLES
    from ndp.kernels.verdict import NO_VOCAB
    from ndp.wire.format import TYP_MASKED_TABLE, TYP_SKIP_TABLE, TYP_WIDTH_TABLE

    offsets = np.array(offs, np.int64)
    out = cuda.device_array(offsets.shape[0], np.int64)
    block = lanes if simulated() else verdict_cuda.LANES_BLOCK
    verdict_cuda.verdicts_lanes_cuda[2, block](
        cuda.to_device(shard), cuda.to_device(offsets), cuda.device_array(0, np.int64), out,
        cuda.to_device(CRC16_TABLES),
        *(cuda.to_device(t) for t in (TYP_WIDTH_TABLE, TYP_MASKED_TABLE, TYP_SKIP_TABLE)),
        np.int64(NO_VOCAB), np.int64(lanes))
    return out.copy_to_host()


def cpu_verdicts(shard: np.ndarray, offs: list) -> np.ndarray:
    from ndp.kernels.verdict import NO_VOCAB, verdicts_cpu

    out = np.empty(len(offs), np.int64)
    verdicts_cpu(shard, np.array(offs, np.int64), np.zeros(0, np.int64), out, NO_VOCAB)
    return out


if __name__ == "__main__":
    sys.exit(main())
