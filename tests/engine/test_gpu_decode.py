"""The CUDA decoder (ndp.engine.cuda_decoder) against the CPU decoder, bit for bit: same rows, same
labels, same dropped packets with the same reasons, from host staging and from device-resident
shards. Runs under Numba's CUDA simulator without a GPU (small inputs), on the device with one."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ndp.engine.reference import StreamExhausted
from ndp.engine.decoder import CpuDecoder, Decoder
from ndp.errors import ConfigError
from ndp.engine.cuda_decoder import CudaDecoder
from ndp.store.index import load_index
from ndp.store.shard import Shard

from ndp_test_helpers import base_stream, corrupt, corruption, drop_case, ramp_stream

PADDED = ("input_ids", "labels", "attention_mask", "lengths", "status", "rows")


def host(array) -> np.ndarray:
    return array if isinstance(array, np.ndarray) else array.copy_to_host()


def assert_same_padded(gpu, cpu):
    for name in PADDED:
        np.testing.assert_array_equal(host(getattr(gpu, name)), getattr(cpu, name), err_msg=name)
    assert gpu.stats == cpu.stats


def assert_same_packed(gpu, cpu):
    np.testing.assert_array_equal(host(gpu.x), cpu.x)
    np.testing.assert_array_equal(host(gpu.y), cpu.y)
    np.testing.assert_array_equal(host(gpu.status), cpu.status)
    assert (gpu.start, gpu.next_start, gpu.stream_tokens) == (
        cpu.start, cpu.next_start, cpu.stream_tokens)
    assert gpu.stats == cpu.stats


@pytest.fixture(scope="module")
def dec():
    return CudaDecoder(ring=2)


@pytest.fixture(scope="module")
def cpu():
    return CpuDecoder(ring=2)


@pytest.mark.parametrize("resident", [False, True])
def test_every_drop_reason_padded_and_packed(dec, cpu, resident):
    data, offsets, _ = drop_case()
    data = np.frombuffer(data, np.uint8)
    source = dec.resident(data) if resident else data
    for max_len in (3, 12):
        assert_same_padded(dec.decode_padded(source, offsets, seq_len=max_len,
                                             pad_token_id=5),
                           cpu.decode_padded(data, offsets, seq_len=max_len,
                                             pad_token_id=5))
    for batch_size, seq_len, start in ((2, 4, 0), (1, 9, 3), (None, 5, 1)):
        assert_same_packed(
            dec.decode_packed(source, offsets, batch_size=batch_size, seq_len=seq_len,
                              start=start),
            cpu.decode_packed(data, offsets, batch_size=batch_size, seq_len=seq_len, start=start),
        )


@settings(max_examples=10)
@given(st.lists(corruption, min_size=1, max_size=3), st.lists(st.integers(-50, 2000), max_size=5),
       st.integers(1, 24), st.booleans())
def test_property_corrupted_shard_same_batches_as_cpu(ops, hostile, max_len, resident):
    dec, cpu = _shared()
    base = base_stream()
    data = np.frombuffer(corrupt(base.data, ops), np.uint8)
    offsets = list(base.offsets) + hostile
    source = dec.resident(data) if resident else data
    ref = cpu.decode_padded(data, offsets, seq_len=max_len, pad_token_id=3)
    assert_same_padded(dec.decode_padded(source, offsets, seq_len=max_len,
                                         pad_token_id=3), ref)
    try:
        want = cpu.decode_packed(data, offsets, batch_size=2, seq_len=max_len)
    except StreamExhausted:
        with pytest.raises(StreamExhausted):
            dec.decode_packed(source, offsets, batch_size=2, seq_len=max_len)
    else:
        assert_same_packed(dec.decode_packed(source, offsets, batch_size=2, seq_len=max_len),
                           want)


_SHARED: list = []


def _shared():
    """One decoder pair for every hypothesis example (fixtures are per test, not per example);
    a large budget, since every example makes a resident copy."""
    if not _SHARED:
        _SHARED.extend([CudaDecoder(ring=2, device_budget=1 << 40), CpuDecoder(ring=2)])
    return _SHARED


def test_shard_file_with_its_index(dec, cpu, ramp_shard):
    info, stream = ramp_shard
    shard = Shard(info.path)
    offsets = load_index(shard).entries["offset"].astype(np.int64)
    assert offsets.tolist() == stream.offsets
    gpu = dec.decode_padded(dec.resident(shard), offsets, seq_len=64)
    assert_same_padded(gpu, cpu.decode_padded(shard.data, offsets, seq_len=64))
    assert gpu.stats.valid == len(stream.offsets)


def test_submitted_batches_resolve_in_any_order_and_stay_valid_for_the_ring():
    stream = ramp_stream([3, 5, 8, 2, 9, 4], width=2)
    data = stream.array
    cpu = CpuDecoder(ring=3)
    dec = CudaDecoder(ring=3)
    cases = [stream.offsets[:k] for k in (2, 6, 4)]
    pending = [dec.submit_padded(data, offs, seq_len=6) for offs in cases]
    batches = [p.result() for p in reversed(pending)][::-1]
    for batch, offs in zip(batches, cases):
        assert_same_padded(batch, cpu.decode_padded(data, offs, seq_len=6))
    # a fourth submit reuses the first slot: the first batch is read before that, the second
    # and third are untouched
    fourth = dec.decode_padded(data, stream.offsets[3:], seq_len=6)
    assert_same_padded(fourth, cpu.decode_padded(data, stream.offsets[3:], seq_len=6))
    for batch, offs in zip(batches[1:], cases[1:]):
        assert_same_padded(batch, cpu.decode_padded(data, offs, seq_len=6))


def test_a_pending_batch_is_read_before_its_slot_is_reused():
    stream = ramp_stream([3, 5], width=4)
    dec = CudaDecoder(ring=2)
    first = dec.submit_padded(stream.array, stream.offsets, seq_len=4)
    dec.submit_padded(stream.array, stream.offsets[:1], seq_len=4)
    dec.submit_padded(stream.array, stream.offsets[1:], seq_len=4)  # takes first's slot
    assert first.result().stats.valid == 2


def test_buffers_grow_for_more_packets_and_longer_rows(dec, cpu):
    small = ramp_stream([2, 3])
    big = ramp_stream(list(range(1, 70)), width=4)
    for stream, max_len in ((small, 4), (big, 4), (big, 33), (small, 33), (big, 33)):
        assert_same_padded(dec.decode_padded(stream.array, stream.offsets, seq_len=max_len),
                           cpu.decode_padded(stream.array, stream.offsets, seq_len=max_len))


def test_empty_batches(dec, cpu):
    stream = ramp_stream([4])
    gpu = dec.decode_padded(stream.array, [], seq_len=4)
    assert host(gpu.input_ids).shape == (0, 4)
    assert gpu.stats == cpu.decode_padded(stream.array, [], seq_len=4).stats
    with pytest.raises(StreamExhausted):
        dec.decode_packed(stream.array, [], batch_size=1, seq_len=2)
    with pytest.raises(StreamExhausted, match="hold 4"):
        dec.decode_packed(stream.array, stream.offsets, batch_size=2, seq_len=2)


def test_bad_arguments(dec):
    stream = ramp_stream([4])
    with pytest.raises(ConfigError):
        dec.decode_padded(stream.array, stream.offsets, seq_len=0)
    with pytest.raises(ConfigError):
        dec.decode_packed(stream.array, stream.offsets, batch_size=0, seq_len=2)
    with pytest.raises(ConfigError, match="ring"):
        CudaDecoder(ring=1)


def test_resident_shards_respect_the_device_budget():
    stream = ramp_stream([10, 10])
    dec = CudaDecoder(device_budget=len(stream.data) + 10)
    dec.resident(stream.array, name="first")
    assert dec.resident_bytes == len(stream.data)
    with pytest.raises(ConfigError, match="second.*device_budget"):
        dec.resident(stream.array, name="second")


def test_backend_choice(monkeypatch):
    import ndp.engine.backend as backend

    assert isinstance(Decoder(backend="cpu"), CpuDecoder)
    assert isinstance(Decoder(backend="cuda"), CudaDecoder)
    with pytest.raises(ConfigError, match="backend must be one of"):
        Decoder(backend="tpu")
    if backend.simulated():
        assert isinstance(Decoder(), CpuDecoder)  # "auto" never picks the simulator
    monkeypatch.setattr(backend, "cuda_unavailable_reason", lambda: "no CUDA device was found")
    assert isinstance(Decoder(), CpuDecoder)
    with pytest.raises(ConfigError, match="no CUDA device was found.*backend='cpu'"):
        Decoder(backend="cuda")


def test_same_batches_from_both_backends_through_the_common_api():
    data, offsets, _ = drop_case()
    data = np.frombuffer(data, np.uint8)
    a, b = Decoder(backend="cpu"), Decoder(backend="cuda")
    assert (a.backend, b.backend) == ("cpu", "cuda")
    assert_same_padded(b.decode_padded(b.resident(data), offsets, seq_len=8),
                       a.decode_padded(a.resident(data), offsets, seq_len=8))


@pytest.mark.simulator  # on a device, test_gpu_device's first decode after a resident copy
def test_a_resident_shard_is_copied_on_the_stream_the_kernels_run_on(monkeypatch, ramp_shard):
    """F4: the copy of a resident shard is queued on the decoder's compute stream, so the first
    decode after it is ordered after it (a copy on the legacy stream from pageable memory may
    still be landing when a kernel on ndp's non-blocking stream starts)."""
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    streams = []
    real = FakeCUDAArray.copy_to_device

    def spy(self, ary, stream=0):
        streams.append(stream)
        return real(self, ary, stream=stream)

    monkeypatch.setattr(FakeCUDAArray, "copy_to_device", spy)
    info, stream = ramp_shard
    dec = CudaDecoder()
    streams.clear()
    dec.resident(np.frombuffer(stream.data, np.uint8))
    assert streams == [dec.engine.compute_stream]
