"""Which GPU a Loader decodes on (ndp.engine.gpu): chosen once, from ``device``, torch's
current device, ``LOCAL_RANK`` or 0, and made current in every thread that does its CUDA work:
for good in the producer thread, for the call only in the constructing and consuming threads.
Under Numba's simulator there is one device: the choice is checked with a stand-in device
count, and the threads by what each asked for (``ACTIVATIONS``)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import ndp.engine.gpu as gpu
from ndp.errors import ConfigError
from ndp.loader.loader import Loader

from ndp_test_helpers import ramp_specs, write_shards


def torch_with(device: int | None):
    """A stand-in torch whose CUDA is initialised on ``device`` (``None``: not initialised)."""
    cuda = types.SimpleNamespace(is_available=lambda: True,
                                 is_initialized=lambda: device is not None,
                                 current_device=lambda: device)
    return types.SimpleNamespace(cuda=cuda)


@pytest.mark.parametrize("count, device, torch_device, local_rank, want", [
    (8, 5, 2, "3", 5),          # given: taken
    (8, None, 2, "3", 2),       # torch has a current device: that one
    (8, None, None, "3", 3),    # torch imported, CUDA not initialised: LOCAL_RANK
    (1, None, None, "3", 0),    # one visible device a rank (CUDA_VISIBLE_DEVICES): that one
    (8, None, "absent", None, 0),  # no torch, no LOCAL_RANK: 0
])
def test_the_device_is_the_one_given_else_torchs_else_local_rank_else_0(
        monkeypatch, count, device, torch_device, local_rank, want):
    monkeypatch.setattr(gpu, "device_count", lambda: count)
    if torch_device == "absent":
        monkeypatch.delitem(sys.modules, "torch", raising=False)
    else:
        monkeypatch.setitem(sys.modules, "torch", torch_with(torch_device))
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    assert gpu.choose_device(device) == want


@pytest.mark.parametrize("device, local_rank, match", [
    (4, None, r"`device`=4 \(from device\): this process sees 2 CUDA device"),
    (None, "5", r"`device`=5 \(from LOCAL_RANK\)"),
    (True, None, "`device`=True"),
    (None, "two", "LOCAL_RANK='two' is not a number"),
])
def test_a_device_this_process_does_not_see_is_refused(monkeypatch, device, local_rank, match):
    monkeypatch.setattr(gpu, "device_count", lambda: 2)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    with pytest.raises(ConfigError, match=match):
        gpu.choose_device(device)


def test_every_thread_doing_a_loaders_cuda_work_makes_its_device_current(tmp_path):
    write_shards(tmp_path, [s.encode() for s in ramp_specs([5 + k % 9 for k in range(60)])])
    gpu.ACTIVATIONS.clear()
    loader = Loader(tmp_path, mode="padded", batch_size=4, seq_len=8, backend="cuda",
                    output="arrays", device=0, chunk_batches=2)
    assert loader.device == 0 and loader.engine.device == 0
    built = list(gpu.ACTIVATIONS)
    assert ("MainThread", 0, "activate") in built  # streams, tables, arena: on device 0
    batches = [np.asarray(b["input_ids"].copy_to_host()) for b in loader]
    assert batches and ("ndp-loader", 0, "select") in gpu.ACTIVATIONS  # the producer's
    assert all(d == 0 for _, d, _ in gpu.ACTIVATIONS)
    loader.close()
    assert Loader(tmp_path, mode="padded", batch_size=4, seq_len=8, backend="cpu",
                  output="arrays").device is None
