"""The producer thread of a ``Loader``: started from a state, its items taken, stopped
(``ProducerThread``).

One thread (``ndp-loader``) runs ``ndp.loader.pipeline.producer.Producer.run`` into a bounded queue:
a
chunk ahead per ``prefetch``, and room for an epoch's end besides (it holds no ring slot, and
waiting to put it kept the next epoch's first chunk from being decoded until the consumer took
the last one: a stall at every boundary after a short chunk). An exception in the producer
comes out of ``get`` with its traceback chained; ``stop`` ends the thread, the plan's thread
and a window's entries being read ahead, whatever they are waiting on.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import weakref
from typing import Any

from ndp.errors import LoaderUsageError
from ndp.loader.pipeline.producer import Failure


#: loaders whose producer thread may be running: stopped at interpreter exit (below)
LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    """Stop every producer before the interpreter finalizes. A daemon thread still inside
    compiled code then (a kernel, a compile) is ended by pthread_exit when it next takes the
    GIL, which aborts the process ("terminate called without an active exception", SIGABRT)
    in a script that simply ended without ``close()``."""
    for loader in list(LIVE):
        loader._stop_producer()


def _forked() -> None:
    """In a child process just forked: a Loader whose threads were running at the fork is
    refused there by name (``refuse_if_forked``: its producer, plan and warmer threads are not
    in the child, and a lock one of them held stays held); one that never ran, or was
    stopped, starts its own."""
    for loader in list(LIVE):
        if loader._running.running:
            loader._forked_from = loader._pid
        loader._pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def refuse_if_forked(loader: Any) -> None:
    """``LoaderUsageError`` if ``loader`` was running when this process was forked from the
    one it was made in."""
    if loader._forked_from is not None:
        raise LoaderUsageError(
            f"this Loader was running in process {loader._forked_from} when it forked this one "
            f"({os.getpid()}): its producer threads are not here, and a lock they held stays "
            f"held. Make a Loader in the child process (a Loader made before the fork and not "
            f"iterated yet works in the child), or use NDPDataset with DataLoader workers")


class ProducerThread:
    """The running producer of a Loader (module docstring)."""

    def __init__(self, producer: Any, ring: Any, plan: Any, prefetch: int) -> None:
        self.producer, self.ring, self.plan, self.prefetch = producer, ring, plan, prefetch
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._queue: queue.Queue | None = None

    @property
    def running(self) -> bool:
        """A producer thread was started and not stopped."""
        return self._thread is not None

    def start(self, state: dict) -> None:
        """Stop any producer, then run one from ``state`` (epoch, position, batch)."""
        self.stop()
        self._stop.clear()
        self.ring.reset()  # chunks left in the queue or unfinished are the producer's again
        self._queue = queue.Queue(maxsize=max(1, self.prefetch) + 1)
        self._thread = threading.Thread(target=self.producer.run,
                                        args=(dict(state), self._queue, self._stop),
                                        name="ndp-loader", daemon=True)
        self._thread.start()

    def get(self) -> Any:
        """The producer's next item; its exception raised here (the producer stopped first).
        ``LoaderUsageError`` if the producer is stopped meanwhile by another thread
        (``Loader.close()``, ``load_state_dict``): the thread and queue waited on are this
        call's own, never another thread's half-reset ones."""
        thread, items = self._thread, self._queue
        while True:
            if thread is None or self._thread is not thread:
                raise LoaderUsageError(
                    "this Loader was closed or reset (close() or load_state_dict(), from "
                    "another thread) while a loop waited for its next batch; start a new loop "
                    "to go on from where it stopped")
            try:
                item = items.get(timeout=0.1)
            except queue.Empty:
                if thread.is_alive() or not items.empty():
                    continue
                if self._stop.is_set() or self._thread is not thread:
                    continue  # stopped by another thread: said by name above, once stop() ends
                self._thread = None
                raise RuntimeError("ndp loader: the producer thread ended without a result")
            if isinstance(item, Failure):
                self.stop()
                raise item.exc
            return item

    def stop(self) -> None:
        """End the producer thread (and the plan's and the warmer's): idempotent."""
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        self.plan.stop_ahead()  # first: the producer may be waiting for that plan
        while thread.is_alive():
            try:  # unblock a producer waiting on a full queue
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            thread.join(timeout=0.05)
        self.plan.stop_ahead()  # and one it started since
        self.producer.warmer.stop()  # a window's entry table being built ahead: abandoned
        self._thread = None
