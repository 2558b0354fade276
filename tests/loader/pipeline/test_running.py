"""The producer thread of a Loader (``ndp.loader.pipeline.running``) from other threads and processes:
``close()`` from another thread while a loop waits ends that loop with ``LoaderUsageError``
(it once raised ``AttributeError`` on the thread the close had reset), and a Loader used in a
process forked from one where it was running is refused by name, while one that had not run
yet works there (``ndp.loader.pipeline.running._forked``)."""

from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import pytest

from ndp.errors import LoaderUsageError
from ndp.loader.pipeline.chunks import ChunkDecoder
from ndp.loader.loader import Loader
from ndp.wire.packet import encode_tokens

from ndp_test_helpers import ramp, write_shards

KW = dict(mode="padded", batch_size=2, seq_len=8, backend="cpu", output="arrays", seed=1,
          chunk_batches=1, prefetch=1)


@pytest.fixture
def data(tmp_path):
    write_shards(tmp_path, [encode_tokens(ramp(k, 5)) for k in range(40)])
    return tmp_path


def test_close_from_another_thread_ends_a_waiting_loop_by_name(data, monkeypatch):
    entered, release = threading.Event(), threading.Event()
    real = ChunkDecoder.decode
    calls = []

    def slow(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # the consumer has had its batches and waits for this chunk
            entered.set()
            release.wait(10)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ChunkDecoder, "decode", slow)
    loader = Loader(data, **KW)
    it = iter(loader)
    next(it), next(it)

    def closer():
        entered.wait(10)
        threading.Timer(0.2, release.set).start()  # the producer lets go after the close
        loader.close()

    other = threading.Thread(target=closer)
    other.start()
    # the close may come while next() waits for the chunk (said as a close from another
    # thread) or just before it asks (the loop's Loader was closed): a named error either way
    with pytest.raises(LoaderUsageError, match="closed or reset .*another thread|was closed"):
        next(it)
    other.join()
    again = Loader(data, **KW)  # nothing of the first is left behind
    assert len(list(again)) == len(again)
    again.close()


class _Quits:
    """A producer that ends without putting anything, as one told to stop does."""

    class warmer:  # noqa: N801 - the attribute ProducerThread.stop joins
        @staticmethod
        def join():
            pass

    def run(self, state, items, stop):
        pass


class _Plan:
    def stop_ahead(self):
        pass


class _Ring:
    def reset(self):
        pass


def test_a_producer_that_ends_without_a_result_is_an_error_unless_it_was_stopped():
    from ndp.loader.pipeline.running import ProducerThread

    alone = ProducerThread(_Quits(), _Ring(), _Plan(), prefetch=1)
    alone.start({})
    with pytest.raises(RuntimeError, match="ended without a result"):
        alone.get()

    # stop() from another thread: the producer has ended and the queue is drained, but stop()
    # is still joining the plan's and the warmer's threads. A loop that looks then must wait
    # for the close and name it (CI once saw the RuntimeError in that window)
    stopping = ProducerThread(_Quits(), _Ring(), _Plan(), prefetch=1)
    stopping.start({})
    stopping._thread.join()
    stopping._stop.set()  # stop() has begun ...
    finish = threading.Timer(0.3, setattr, args=(stopping, "_thread", None))  # ... and ends
    finish.start()
    with pytest.raises(LoaderUsageError, match="closed or reset"):
        stopping.get()
    finish.join()


def _in_child(loader, out):
    try:
        out.send([b["input_ids"].copy() for b in loader])
    except Exception as exc:  # noqa: BLE001 - sent to the parent to check
        out.send(f"{type(exc).__name__}: {exc}")


def _child(loader):
    parent, child = multiprocessing.get_context("fork").Pipe()
    proc = multiprocessing.get_context("fork").Process(target=_in_child, args=(loader, child))
    proc.start()
    got = parent.recv() if parent.poll(60) else "no answer in 60 s"
    proc.join(30)
    return got


def test_a_loader_running_at_a_fork_is_refused_in_the_child(data):
    loader = Loader(data, **KW)
    it = iter(loader)
    next(it)  # its producer runs
    got = _child(loader)
    assert isinstance(got, str) and got.startswith("LoaderUsageError") and "fork" in got
    assert len(list(it)) == len(loader) - 1  # the parent's loop goes on
    loader.close()


def test_a_loader_made_before_a_fork_and_not_run_works_in_the_child(data):
    loader = Loader(data, **KW)
    got = _child(loader)
    want = [b["input_ids"].copy() for b in loader]
    assert not isinstance(got, str), got
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
    loader.close()
