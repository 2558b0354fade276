"""The batch source in a real (tiny) training loop on the CPU: a causal LM trains on padded and
packed batches from ndp.Loader, and on ndp.NDPDataset through torch's DataLoader; a run stopped
mid-epoch and resumed from its state_dict ends with exactly the parameters of a run that was
never stopped."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from torch import nn

from ndp.loader.loader import Loader

from ndp_test_helpers import ramp_specs, write_shards

VOCAB = 97


class TinyLM(nn.Module):
    """Embedding -> one causal self-attention layer -> logits (ids folded into a small vocab)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(VOCAB, 16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.out = nn.Linear(16, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids % VOCAB)
        t = ids.shape[1]
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        h = h + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        return self.out(h)


def fold(labels: torch.Tensor) -> torch.Tensor:
    return torch.where(labels == -100, labels, labels % VOCAB)


def loss_of(model: TinyLM, batch: dict, mode: str) -> torch.Tensor:
    if mode == "packed":
        logits, target = model(batch["x"]), fold(batch["y"])
    else:  # padded: predict token t+1 from tokens <= t
        logits, target = model(batch["input_ids"])[:, :-1], fold(batch["labels"])[:, 1:]
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1),
                                       ignore_index=-100)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("train")
    lengths = [int(x) for x in np.random.default_rng(1).integers(4, 40, 60)]
    specs = ramp_specs(lengths, masked=[k % 3 == 0 for k in range(60)], stride=7)
    packets = [s.encode() for s in specs]
    write_shards(d, packets[:35], prefix="a")
    write_shards(d, packets[35:], prefix="b")
    return d


def make_loader(data_dir, mode: str) -> Loader:
    return Loader(data_dir, mode=mode, batch_size=4, seq_len=16, seed=3, crc_drop_rate=0.05,
                  backend="cpu", prefetch=2)


def train(data_dir, mode: str, steps: int, *, resume: dict | None = None,
          stop_after: int | None = None):
    """Train ``steps`` steps in all (over epochs); optionally start from ``resume`` and stop
    after ``stop_after`` steps, returning a checkpoint."""
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = make_loader(data_dir, mode)
    done = 0
    if resume is not None:
        model.load_state_dict(resume["model"])
        opt.load_state_dict(resume["opt"])
        loader.load_state_dict(json.loads(resume["loader"]))
        done = resume["done"]
    losses = []
    while done < steps:
        for batch in loader:
            loss = loss_of(model, batch, mode)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            done += 1
            if done == stop_after:
                ckpt = {"model": copy.deepcopy(model.state_dict()),
                        "opt": copy.deepcopy(opt.state_dict()),
                        "loader": json.dumps(loader.state_dict()), "done": done}
                loader.close()
                return model, losses, ckpt
            if done == steps:
                break
    loader.close()
    return model, losses, None


@pytest.mark.parametrize("mode", ["padded", "packed"])
def test_resumed_training_ends_with_the_same_parameters(data_dir, mode):
    steps = 40  # more than one epoch in both modes
    full, losses, _ = train(data_dir, mode, steps)
    assert np.mean(losses[-8:]) < np.mean(losses[:8])  # it learns something
    _, _, ckpt = train(data_dir, mode, steps, stop_after=13)  # mid-epoch
    resumed, _, _ = train(data_dir, mode, steps, resume=ckpt)
    for (name, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name


def test_torch_dataloader_over_ndp_dataset_trains(data_dir):
    from ndp.adapters.dataset import NDPDataset

    ds = NDPDataset(data_dir, seq_len=16, pad_token_id=0, crc_drop_rate=0.05)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2,
                                         generator=torch.Generator().manual_seed(0))
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(3):
        for batch in loader:
            assert batch["input_ids"].dtype == torch.int64 and batch["input_ids"].shape[1] == 16
            loss = loss_of(model, batch, "padded")
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert np.isfinite(losses).all() and np.mean(losses[-5:]) < np.mean(losses[:5])
