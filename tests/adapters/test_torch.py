"""The torch adapter: batches of either backend become int64 tensors that embedding and
cross_entropy take, without a copy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ndp.adapters.torch import tensor, to_torch
from ndp.engine.decoder import Decoder
from ndp.wire.format import IGNORE_INDEX

from ndp_test_helpers import drop_case


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_padded_batch_feeds_embedding_and_cross_entropy(backend):
    data, offsets, _ = drop_case()
    data = np.frombuffer(data, np.uint8)
    dec = Decoder(backend=backend)
    batch = dec.decode_padded(dec.resident(data), offsets, seq_len=10, pad_token_id=0)
    ref = Decoder(backend="cpu").decode_padded(data, offsets, seq_len=10)
    tensors = to_torch(batch)
    assert set(tensors) == {"input_ids", "labels", "attention_mask"}
    for name, t in tensors.items():
        assert t.dtype == torch.int64
        np.testing.assert_array_equal(t.cpu().numpy(), getattr(ref, name))
    ids = tensors["input_ids"] % 64
    # the model lives where the batch lives (cuda:0 on a GPU, the CPU under the simulator)
    logits = torch.nn.Embedding(64, 64).to(ids.device)(ids)
    labels = torch.where(tensors["labels"] == IGNORE_INDEX, IGNORE_INDEX, tensors["labels"] % 64)
    loss = torch.nn.functional.cross_entropy(logits.view(-1, 64), labels.view(-1),
                                             ignore_index=IGNORE_INDEX)
    assert torch.isfinite(loss)


def test_cpu_tensors_alias_the_decoder_ring_without_a_copy():
    data, offsets, _ = drop_case()
    data = np.frombuffer(data, np.uint8)
    batch = Decoder(backend="cpu").decode_padded(data, offsets, seq_len=4)
    t = tensor(batch.input_ids)
    assert t.data_ptr() == batch.input_ids.ctypes.data


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_packed_batch_gives_x_and_y(backend):
    data, offsets, _ = drop_case()
    data = np.frombuffer(data, np.uint8)
    batch = Decoder(backend=backend).decode_packed(data, offsets, batch_size=2, seq_len=5)
    tensors = to_torch(batch)
    assert set(tensors) == {"x", "y"}
    ref = Decoder(backend="cpu").decode_packed(data, offsets, batch_size=2, seq_len=5)
    np.testing.assert_array_equal(tensors["x"].cpu().numpy(), ref.x)
    np.testing.assert_array_equal(tensors["y"].cpu().numpy(), ref.y)


def test_other_objects_are_refused():
    with pytest.raises(TypeError, match="PaddedBatch or PackedBatch"):
        to_torch({"input_ids": np.zeros(3)})
