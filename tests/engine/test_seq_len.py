"""``seq_len`` is the one name of a row's length across the API. ``max_seq_length``, its old name
in ``decode_padded``, ``PaddedBuffers`` and the decoders (and ``NDPDataset``:
tests/adapters/test_dataset.py), still works: one ``DeprecationWarning`` that names ``seq_len``,
pointing at the caller's line, and the same rows bit for bit. Both names at once are refused."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from ndp.engine.cpu_decoder import CpuDecoder
from ndp.engine.cuda_decoder import CudaDecoder
from ndp.engine.reference import PaddedBuffers, decode_padded
from ndp.errors import ConfigError

from ndp_test_helpers import ramp_stream

PADDED = ("input_ids", "labels", "attention_mask", "lengths", "status", "rows")
OLD = r"`max_seq_length` is deprecated.*`seq_len`"


def host(array) -> np.ndarray:
    return array if isinstance(array, np.ndarray) else array.copy_to_host()


def assert_same_padded(got, want) -> None:
    for name in PADDED:
        np.testing.assert_array_equal(host(getattr(got, name)), host(getattr(want, name)),
                                      err_msg=name)
    assert got.stats == want.stats


def by_old_name(call, *args, **kwargs):
    """``call(*args, **kwargs)`` (which passes ``max_seq_length``): it must warn once, naming
    ``seq_len``, at this line (the caller's), not inside ndp."""
    with pytest.warns(DeprecationWarning, match=OLD) as caught:
        result = call(*args, **kwargs)
    ours = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(ours) == 1 and ours[0].filename == __file__
    return result


@pytest.fixture(scope="module")
def stream():
    """Ramp packets shorter and longer than 8 tokens, some with a loss mask."""
    return ramp_stream([3, 9, 20, 1, 8], masked=True)


def test_decode_padded_takes_its_old_name(stream):
    want = decode_padded(stream.array, stream.offsets, seq_len=8, pad_token_id=5)
    got = by_old_name(decode_padded, stream.array, stream.offsets, max_seq_length=8,
                      pad_token_id=5)
    assert want.input_ids.shape == (5, 8)
    assert_same_padded(got, want)


def test_padded_buffers_take_the_old_name():
    out = by_old_name(PaddedBuffers.allocate, 4, max_seq_length=8)
    assert out.input_ids.shape == PaddedBuffers.allocate(4, seq_len=8).input_ids.shape == (4, 8)
    by_old_name(out.check, 4, max_seq_length=8)


@pytest.mark.parametrize("make", [CpuDecoder, CudaDecoder], ids=["cpu", "cuda"])
def test_decoders_take_the_old_name(stream, make):
    dec = make(ring=4)  # the three batches below stay valid together
    want = dec.decode_padded(stream.array, stream.offsets, seq_len=8, pad_token_id=5)
    got = by_old_name(dec.decode_padded, stream.array, stream.offsets, max_seq_length=8,
                      pad_token_id=5)
    assert_same_padded(got, want)
    queued = by_old_name(dec.submit_padded, stream.array, stream.offsets, max_seq_length=8,
                         pad_token_id=5)
    assert_same_padded(queued.result(), want)


@pytest.mark.parametrize("make", [CpuDecoder, CudaDecoder], ids=["cpu", "cuda"])
def test_both_names_at_once_are_refused(stream, make):
    dec = make(ring=2)
    calls = [lambda **kw: decode_padded(stream.array, stream.offsets, **kw),
             lambda **kw: dec.decode_padded(stream.array, stream.offsets, **kw),
             lambda **kw: dec.submit_padded(stream.array, stream.offsets, **kw),
             lambda **kw: PaddedBuffers.allocate(4, **kw)]
    for call in calls:
        with pytest.raises(ConfigError, match=r"`seq_len`.*`max_seq_length`"):
            call(seq_len=8, max_seq_length=8)
    with pytest.raises(ConfigError, match=r"`seq_len`.*`max_seq_length`"):
        PaddedBuffers.allocate(4, 8, max_seq_length=8)  # the new name given by position


def test_signatures_say_seq_len():
    """What help() and an editor show: the new name only (the old one is the wrapper's)."""
    for fn in (decode_padded, PaddedBuffers.allocate, PaddedBuffers.check,
               CpuDecoder.decode_padded, CpuDecoder.submit_padded,
               CudaDecoder.decode_padded, CudaDecoder.submit_padded):
        params = inspect.signature(fn).parameters
        assert "seq_len" in params and "max_seq_length" not in params, fn.__qualname__
