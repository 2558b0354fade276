"""ndp.store.prefetch: a shard the decoder's own fetch gave up on is not downloaded again behind
the consumer's error, and a shard another fetch is downloading is left to it."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ndp.store.cache import ShardCache
from ndp.store.prefetch import Prefetcher
from ndp.store.readers import ShardBusy


class Dataset:
    """What the prefetcher uses of a ``RemoteDataset``: its entries, cache and fetch."""

    def __init__(self, tmp_path, names, fail=(), busy=(), expect=None):
        self.expect = len(names) if expect is None else expect  # fetches before ``done``
        self.entries = [{"name": n, "bytes": 5, "crc32": None} for n in names]
        self.cache = ShardCache(tmp_path)
        self.fail, self.busy = set(fail), set(busy)
        self.asked: list[str] = []
        self.done = threading.Event()
        self.gate = threading.Event()  # the first fetch waits for it
        self.gate.set()

    def fetch(self, entry, *, wait=True):
        self.asked.append(entry["name"])
        self.gate.wait(10)
        if len(self.asked) >= self.expect:
            self.done.set()
        if entry["name"] in self.busy:
            raise ShardBusy(entry["name"])
        if entry["name"] in self.fail:
            raise ConnectionResetError("dropped")
        return self.cache.get(entry["name"], 5, lambda out: out.write(b"12345"), wait=wait)


def test_a_shard_the_reader_gave_up_on_is_not_fetched_again_this_epoch(tmp_path):
    data = Dataset(tmp_path, ["a.ndp", "b.ndp", "c.ndp"], expect=2)
    pre = Prefetcher(data)
    pre.gave_up("b.ndp")
    data.gate.clear()  # the prefetcher's first download (a) lasts until b is given up
    pre.plan(np.array([0, 1, 2]), np.array([9, 9, 9]), 0)  # a new epoch: asked for again
    assert 1 not in pre._failed
    pre.gave_up("b.ndp")  # the decoder's own fetch of b failed before the prefetcher got to it
    data.gate.set()
    assert 1 in pre._failed and 1 not in pre._targets
    assert data.done.wait(10)
    pre.close()
    assert "b.ndp" not in data.asked and {"a.ndp", "c.ndp"} <= set(data.asked)


@pytest.mark.parametrize("busy", [True, False])
def test_a_busy_shard_is_left_to_the_fetch_downloading_it_and_a_failed_one_is_not_tried_twice(
        tmp_path, busy):
    data = Dataset(tmp_path, ["a.ndp", "b.ndp"], **({"busy": ["a.ndp"]} if busy
                                                    else {"fail": ["a.ndp"]}))
    pre = Prefetcher(data)
    pre.plan(np.array([0, 1]), np.array([9, 9]), 0)
    assert data.done.wait(10)
    pre.close()
    assert data.asked.count("a.ndp") == 1 and "b.ndp" in data.asked
    assert (0 in pre._failed) is (not busy)  # busy: another fetch has it, nothing failed
