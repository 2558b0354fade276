"""Serve (ndp.loader.pipeline.serve): batches are views of a ring of reused buffers, and a batch the consumer
still holds when its buffers come round again keeps them: ``list(loader)``, kept views and
autograd graphs that saved a batch see the batch's own tokens, not a later batch's; a loop that
drops its batches allocates nothing new. Both backends (CUDA under the simulator), both outputs.
"""

from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest

from ndp.loader.loader import Loader

from ndp_test_helpers import ramp_specs, write_shards

LENGTHS = [int(x) for x in np.random.default_rng(5).integers(1, 14, 60)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """60 ramp packets (some masked) in two shards."""
    d = tmp_path_factory.mktemp("serve")
    packets = [s.encode() for s in ramp_specs(LENGTHS, masked=[k % 4 == 1 for k in range(60)])]
    write_shards(d, packets[:25], prefix="a")
    write_shards(d, packets[25:], prefix="b")
    return d


def host(a) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a
    return a.copy_to_host() if hasattr(a, "copy_to_host") else a.cpu().numpy()  # cuda tensors


def make(corpus, backend, output, mode, **kw) -> Loader:
    return Loader(corpus, mode=mode, batch_size=2, seq_len=8, backend=backend, output=output,
                  chunk_batches=2, seed=3, manifest="ignore", **kw)


def copied_epoch(loader: Loader) -> list[dict]:
    """One epoch, each batch copied as it is taken (what a correct consumer sees)."""
    return [{k: host(v).copy() for k, v in b.items()} for b in loader]


CASES = [("cpu", "arrays"), ("cpu", "torch"), ("cuda", "arrays"), ("cuda", "torch")]


@pytest.mark.parametrize("mode", ["padded", "packed", "packing"])
@pytest.mark.parametrize("backend,output", CASES)
def test_list_of_a_loader_holds_every_batch_intact(corpus, backend, output, mode):
    if output == "torch":
        pytest.importorskip("torch")
    with make(corpus, backend, output, mode) as loader:
        want = copied_epoch(loader)
        assert loader.counters.held_chunks == 0  # a loop that drops its batches: no new buffers
    with make(corpus, backend, output, mode) as loader:
        with pytest.warns(ResourceWarning, match="still referenced") as caught:
            kept = list(loader)
        assert len([w for w in caught if issubclass(w.category, ResourceWarning)]) == 1
        assert loader.counters.held_chunks > 0
        assert len(kept) == len(want) > 2 * len(loader._ring.slots)  # the ring came round
        for got, ref in zip(kept, want):
            for k in ref:
                np.testing.assert_array_equal(host(got[k]), ref[k], err_msg=k)


@pytest.mark.parametrize("backend,output", CASES)
def test_a_loop_that_follows_the_rule_allocates_nothing_and_warns_nothing(corpus, backend,
                                                                         output):
    if output == "torch":
        pytest.importorskip("torch")
    with make(corpus, backend, output, "packed", prefetch=2) as loader:
        with warnings.catch_warnings():
            warnings.simplefilter("error", ResourceWarning)
            previous = None
            for _ in range(3):
                for batch in loader:
                    previous, batch = batch, None  # the current and the previous one, no more
        assert previous is not None
        assert loader.counters.held_chunks == 0
        assert loader.counters.chunks > 3 * len(loader._ring.slots)


def test_a_kept_slice_of_a_batch_keeps_its_tokens(corpus):
    torch = pytest.importorskip("torch")
    with make(corpus, "cpu", "torch", "packed") as loader:
        want = [b["x"][:, 1:].clone() for b in loader]
    with make(corpus, "cpu", "torch", "packed") as loader:
        kept = []
        for batch in loader:
            kept.append(batch["x"][:, 1:])  # a view of the batch, not the batch itself
            del batch
    assert len(kept) == len(want)
    for got, ref in zip(kept, want):
        assert torch.equal(got, ref)


def test_a_loss_kept_with_its_graph_backpropagates_through_its_own_batch(corpus):
    """An embedding saves its input ids for backward: a loss summed over steps before one
    backward (gradient accumulation done wrong, or on purpose) must see each step's ids."""
    torch = pytest.importorskip("torch")
    vocab = 1 + max(1000 * k + n for k, n in enumerate(LENGTHS))
    with make(corpus, "cpu", "torch", "padded") as loader:
        ids = [b["input_ids"].clone() for b in loader]
    expected = torch.bincount(torch.cat([i.flatten() for i in ids]), minlength=vocab)

    emb = torch.nn.Embedding(vocab, 1)
    with make(corpus, "cpu", "torch", "padded") as loader:
        with pytest.warns(ResourceWarning):
            total = sum(emb(b["input_ids"]).sum() for b in loader)
    gc.collect()
    total.backward()
    assert torch.equal(emb.weight.grad[:, 0].to(torch.int64), expected)


@pytest.mark.parametrize("output", ["torch", "arrays"])
def test_a_chunks_arrays_are_ordered_on_its_own_event(corpus, monkeypatch, output):
    """F7/F9: torch output is ordered by the ring itself (the consumer's stream waits on the
    chunk's ``ready`` event when its first batch is taken), so its tensors are exported with
    no stream work; DeviceArrays (output="arrays") wait on the chunk's ``ready`` event, never
    on all that ndp queued after it."""
    from ndp.engine.device import Buffer

    seen = []
    real = Buffer.leased

    def spy(self, stream, array, *, ready=None, ordered=False):
        seen.append((ready, ordered))
        return real(self, stream, array, ready=ready, ordered=ordered)

    monkeypatch.setattr(Buffer, "leased", spy)
    loader = make(corpus, "cuda", output, "packed")
    assert sum(1 for _ in loader) > 2
    loader.close()
    events = {id(slot.ready) for slot in loader._ring.slots}
    assert seen and all(id(ready) in events for ready, _ in seen)
    assert all(ordered == (output == "torch") for _, ordered in seen)


@pytest.mark.parametrize("backend,output", [("cpu", "torch"), ("cpu", "arrays"),
                                            ("cuda", "torch"), ("cuda", "arrays")])
def test_the_batches_are_made_on_the_producer_and_next_only_hands_them_out(
        corpus, backend, output, monkeypatch):
    """Every chunk's outputs are wrapped and cut into batch dicts by the producer thread
    before the chunk is queued (``Ring.prepare``): the training loop's thread makes none, and
    a chunk lets go of its list once taken, so only the batches the user keeps hold it."""
    import threading

    from ndp.loader.pipeline.chunks import Chunk
    from ndp.loader.pipeline.serve import Ring

    if output == "torch":
        pytest.importorskip("torch")
    threads = []
    wrap, take = Ring._views, Chunk.take

    def views(self, slot):
        threads.append(threading.current_thread().name)
        return wrap(self, slot)

    taken = []

    def took(self):
        batches = take(self)
        taken.append((self, len(batches)))
        return batches

    monkeypatch.setattr(Ring, "_views", views)
    monkeypatch.setattr(Chunk, "take", took)
    with make(corpus, backend, output, "packed") as loader:
        n = sum(1 for _ in loader)
    assert n > 3 and set(threads) == {"ndp-loader"}
    assert sum(k for _, k in taken) == n and all(c.batches is None for c, _ in taken)



@pytest.mark.parametrize("output", ["arrays", "torch"])
def test_the_consumer_frees_no_batch_the_producer_lets_go_of_them(corpus, output):
    """A loop that drops its batches frees none of them in its own thread: each chunk's dicts
    and arrays are let go of by the producer (``ndp-loader``) when it takes their slot again
    (on today's code before this, the consumer freed them as it finished each chunk)."""
    if output == "torch":
        pytest.importorskip("torch")
    import threading
    import weakref

    freed: list[str] = []

    def note() -> None:
        freed.append(threading.current_thread().name)

    loader = make(corpus, "cpu", output, "padded", shuffle=False)
    n = 0
    for _ in range(3):
        for batch in loader:
            weakref.finalize(batch["input_ids"], note)
            n += 1
    del batch
    during = list(freed)
    loader.close()
    assert n > 20 and len(during) >= n - 8  # all but the chunks still held
    assert set(during) == {"ndp-loader"}
