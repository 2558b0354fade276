"""Packing's marks (``ndp.loader.planning.count``): the count's pass notes where every
``MARK_EVERY``-th batch of each rank starts in its share, the epoch's count keeps them (and the
shared count's file, for the next Loader), and ``explain`` plans a far batch from the mark
before it instead of from the epoch's start. The marks are where the Loader's batches start,
and steps explained from them, last first, equal the rows delivered (3 ranks, with and
without a token budget; ``MARK_EVERY`` made 3 so that a small epoch has many)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import golden  # noqa: E402
from test_explain import check_batch  # noqa: E402

import ndp  # noqa: E402
import ndp.loader.planning.count as count_module  # noqa: E402
from ndp.loader.planning.reach import Reach  # noqa: E402
from ndp.loader.planning.shared_count import VERSION, SharedCount  # noqa: E402

EVERY = 3
SHAPES = {"rows": dict(batch_size=2, seq_len=48),
          "budget": dict(batch_size=None, seq_len=48, batch_tokens=96)}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return golden.write_datasets(tmp_path_factory.mktemp("marks"))["main"]


def make(data, shape):
    return ndp.Loader(data, mode="packing", seed=7, output="arrays", rank=1, world_size=3,
                      **SHAPES[shape])


@pytest.mark.parametrize("shape", SHAPES)
def test_marks_are_where_the_loaders_batches_start(data, shape, monkeypatch):
    monkeypatch.setattr(count_module, "MARK_EVERY", EVERY)
    with make(data, shape) as loader:
        n = len(loader)
        every, marks = loader.plan.share(0).count.marks
        starts = [0]
        for _ in loader:
            starts.append(loader.state_dict()["pos"])
        fields = {**loader.plan.count_fields(0), "count_version": VERSION}
    assert every == EVERY and len(starts) == n + 1 > 4 * EVERY
    # the rank's batches past the epoch's count (the fewest any rank makes) are marked too
    assert marks[:len(starts[:n:EVERY])] == starts[:n:EVERY]
    assert len(marks) * EVERY < n + EVERY or marks[len(starts[:n:EVERY])] > starts[n - 1]
    assert SharedCount.open(fields).found()["marks"]["at"][1] == marks  # rank 1's, kept
    with make(data, shape) as again:  # a second Loader takes them from the file
        assert again.plan.share(0).count.marks == (EVERY, marks)


@pytest.mark.parametrize("shape", SHAPES)
def test_far_steps_are_explained_from_the_mark_before_them(data, shape, monkeypatch):
    monkeypatch.setattr(count_module, "MARK_EVERY", EVERY)
    asked: list[int] = []
    plain = Reach.chunk_end

    def spy(self, share, pos, *args, **kw):
        asked.append(pos)
        return plain(self, share, pos, *args, **kw)

    with make(data, shape) as loader:
        n = len(loader)
        _, marks = loader.plan.share(0).count.marks
        monkeypatch.setattr(Reach, "chunk_end", spy)
        ahead = {}
        for step in reversed(range(n)):  # last first: no step found on the way to another
            asked.clear()
            ahead[step] = loader.explain(step)
            if step % EVERY and step > EVERY:  # planned from its mark, not from 0
                assert min(asked) == marks[step // EVERY] > 0
        monkeypatch.setattr(Reach, "chunk_end", plain)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            for i, batch in enumerate(loader):
                check_batch(ahead[i], batch, "packing")
    assert len(ahead) == n
