"""Background prefetch: the next batches are drawn while the training step runs.

``Prefetcher(fn, depth)`` calls ``fn()`` on a daemon thread and keeps up to ``depth``
results ready.  An exception in ``fn`` is re-raised by the consumer's next ``next()``
(RLinf's preload thread dies silently and its consumer spins forever instead), and a
wait inside ``fn`` (a rate limiter holding the learner back, a dataset waiting for rows)
ends as soon as :meth:`Prefetcher.close` is called.

Every live prefetcher is stopped at interpreter exit, before native libraries shut down:
a daemon thread still inside a TensorStore read when that happens aborts the process
(``terminate called without an active exception``), which is what a half-consumed
``ReplayDataset`` iterator left for the garbage collector used to do.
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

from ..core.waits import Interrupted, stopped_by
from ..numbers import as_int

_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for p in list(_LIVE):
        p.close()


class Prefetcher:
    """An endless iterator of ``fn()`` results computed ``depth`` ahead."""

    def __init__(self, fn: Callable[[], Any], depth: int = 2):
        depth = as_int(depth, "depth", minimum=1)
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        # The thread holds the queue, the stop event and fn, never this object: dropping
        # an unclosed prefetcher stops it (the finalizer), and then lets go of whatever
        # fn holds (its buffer, which can then be closed and released in turn).
        self._thread = threading.Thread(
            target=_run, args=(fn, self._q, self._stop), name="zreplay-prefetch", daemon=True
        )
        self._thread.start()
        weakref.finalize(self, self._stop.set)
        _LIVE.add(self)

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Any:
        while True:
            if self._stop.is_set():
                raise StopIteration
            try:
                ok, value = self._q.get(timeout=0.1)
            except queue.Empty:
                if not self._thread.is_alive() and self._q.empty():
                    raise StopIteration from None
                continue
            if ok:
                return value
            self.close()
            raise value

    def close(self) -> None:
        """Stop the background thread (batches already drawn are discarded)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        _LIVE.discard(self)

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _run(fn: Callable[[], Any], q: queue.Queue, stop: threading.Event) -> None:
    """The prefetch thread: ``fn()`` results (or the exception that ended it) into ``q``
    until ``stop`` is set."""
    while not stop.is_set():
        try:
            with stopped_by(stop):  # a wait inside fn() ends when close() is called
                item = (True, fn())
        except Interrupted:
            return
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            item = (False, e)
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                break
            except queue.Full:
                continue
        if not item[0]:
            return
