"""Marks (``ndp.loader.planning.marks``): the count's pass notes where every ``MARK_EVERY``-th
batch of each rank starts in its share, the epoch's count keeps them (and the shared count's
file, for the next Loader), and ``explain`` plans a far batch from the mark before it instead of
from the epoch's start. The marks are where the Loader's batches start (its states), and steps
explained from them, last first, equal the rows delivered: packing (3 ranks, with and without a
token budget), packed (whole and split documents), with ``MARK_EVERY`` made 3 so that a small
epoch has many. Packed marks hold only where every packet decodes to its index's tokens
(``ndp.store.clean``): on a damaged shard, or with ``skip_packets``, explain reads the packets
before the step instead, and still equals the Loader."""

from __future__ import annotations

import warnings

import numpy as np
import pytest


import golden  # noqa: E402
from test_explain import check_batch  # noqa: E402
from test_units import documents, write  # noqa: E402

import ndp  # noqa: E402
import ndp.loader.planning.marks as marks_module  # noqa: E402
from ndp.loader.pipeline.chunks import ChunkDecoder  # noqa: E402
from ndp.loader.planning.reach import Reach  # noqa: E402
from ndp.loader.planning.shared_count import VERSION, SharedCount  # noqa: E402

from ndp_test_helpers import ramp_specs, write_shards  # noqa: E402

EVERY = 3
RUNS = {  # mode, dataset, Loader options
    "packing": ("packing", "golden", dict(batch_size=2, seq_len=48)),
    "packing budget": ("packing", "golden", dict(batch_size=None, seq_len=48, batch_tokens=96)),
    "packed": ("packed", "ramp", dict(batch_size=2, seq_len=16)),
    "packed split": ("packed", "split", dict(batch_size=2, seq_len=12,
                                              shuffle_window=1 << 17)),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("marks")
    lengths = [int(x) for x in np.random.default_rng(4).integers(1, 40, 300)]
    packets = [s.encode() for s in ramp_specs(lengths)]
    write_shards(root / "ramp", packets[:150], prefix="a")
    write_shards(root / "ramp", packets[150:], prefix="b")
    write(root / "split", documents(np.random.default_rng(5)))
    return {"golden": golden.write_datasets(root / "golden")["main"], "ramp": root / "ramp",
            "split": root / "split"}


@pytest.fixture(autouse=True)
def _small_marks(monkeypatch):
    monkeypatch.setattr(marks_module, "MARK_EVERY", EVERY)


def make(data, run, **over):
    mode, name, kw = RUNS[run]
    return ndp.Loader(data[name], mode=mode, seed=7, output="arrays", rank=1, world_size=3,
                      **(kw | over))


def states(loader) -> list[list[int]]:
    """Where each batch of the epoch starts: ``[pos, tok]`` before it."""
    at = [[0, 0]]
    for _ in loader:
        state = loader.state_dict()
        at.append([state["pos"], state["tok"]])
    return at


@pytest.mark.parametrize("run", RUNS)
def test_marks_are_where_the_loaders_batches_start(data, run):
    with make(data, run) as loader:
        n = len(loader)
        every, marks = loader.plan.share(0).count.marks
        starts = states(loader)
        fields = {**loader.plan.count_fields(0), "count_version": VERSION}
    want = starts[:n:EVERY]
    assert every == EVERY and n > 4 * EVERY
    # the rank's batches past the epoch's count (the fewest any rank makes) are marked too
    assert marks[:len(want)] == want
    assert SharedCount.open(fields).found()["marks"]["at"][1] == marks  # rank 1's, kept
    with make(data, run) as again:  # a second Loader takes them from the file
        assert again.plan.share(0).count.marks == (EVERY, marks)


def spy_starts(monkeypatch, mode) -> list[int]:
    """The share positions explain's plan (packing) or decode (packed) starts from."""
    asked: list[int] = []
    cls, name = (Reach, "chunk_end") if mode == "packing" else (ChunkDecoder, "decode")
    plain = getattr(cls, name)

    def spy(self, *args, **kw):
        asked.append(args[1] if mode == "packing" else args[2])
        return plain(self, *args, **kw)

    monkeypatch.setattr(cls, name, spy)
    return asked


@pytest.mark.parametrize("run", RUNS)
def test_far_steps_are_explained_from_the_mark_before_them(data, run, monkeypatch):
    mode = RUNS[run][0]
    with make(data, run) as loader:
        n = len(loader)
        _, marks = loader.plan.share(0).count.marks
        asked = spy_starts(monkeypatch, mode)
        ahead = {}
        for step in reversed(range(n)):  # last first: no step found on the way to another
            asked.clear()
            ahead[step] = loader.explain(step)
            if step >= EVERY:  # planned from its mark, not from 0
                assert min(asked) == marks[step // EVERY][0] > 0
        monkeypatch.undo()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            for i, batch in enumerate(loader):
                check_batch(ahead[i], batch, mode)
                assert ahead[i].dropped == loader.explain(i).dropped
    assert len(ahead) == n


@pytest.mark.parametrize("why", ["damaged", "skip_packets"])
def test_packed_marks_are_not_used_where_packets_may_not_be_as_indexed(data, why, tmp_path,
                                                                       monkeypatch):
    """A byte of a packet's tokens changed after indexing (its CRC now fails: the Loader drops
    it, the stream runs short of the index's counts), or a packet left out by
    ``skip_packets``: explain reads the packets from the epoch's start, and equals the Loader."""
    import shutil

    shutil.copytree(data["ramp"], tmp_path / "d")
    over = {}
    if why == "damaged":
        for shard in sorted((tmp_path / "d").glob("*.ndp")):
            raw = bytearray(shard.read_bytes())
            for at in range(2_000, len(raw), 2_000):  # a byte of a packet every 2 KB
                raw[at] ^= 0xFF
            shard.write_bytes(bytes(raw))
    else:
        over["skip_packets"] = [5]
    loader = ndp.Loader(tmp_path / "d", mode="packed", seed=7, output="arrays", rank=1,
                        world_size=3, **(RUNS["packed"][2] | over))
    with loader:
        n = len(loader)
        assert loader.plan.share(0).count.marks is not None
        asked = spy_starts(monkeypatch, "packed")
        last = loader.explain(n - 1)
        assert min(asked) == 0  # from the epoch's start
        monkeypatch.undo()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            *_, batch = loader
        check_batch(last, batch, "packed")
        if why == "damaged":  # this rank met some before its last batch
            assert sum(loader.stats.corrupt.values()) > 0


@pytest.mark.parametrize("run", ["packing", "packed"])
def test_a_resumed_loader_explains_from_its_state_or_a_later_mark(data, run, monkeypatch):
    """Resumed from a state a few steps in: the steps after it are found from the state or
    from a mark past it, whichever is later, and equal what the resumed Loader delivers."""
    import json

    with make(data, run) as first:
        it = iter(first)
        for _ in range(EVERY + 1):
            next(it)
        state = json.loads(json.dumps(first.state_dict()))
    with make(data, run) as loader:
        loader.load_state_dict(state)
        n, at = len(loader), loader.step
        _, marks = loader.plan.share(0).count.marks
        asked = spy_starts(monkeypatch, RUNS[run][0])
        ahead = {}
        for step in reversed(range(at, n)):
            asked.clear()
            ahead[step] = loader.explain(step)
            mark = (step // EVERY) * EVERY
            want = marks[step // EVERY][0] if mark > at else state["pos"]
            assert min(asked) == want
        monkeypatch.undo()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            for batch in loader:
                check_batch(ahead[loader.step - 1], batch, RUNS[run][0])
    assert len(ahead) == n - at > EVERY
