"""Waits that ``close()`` cuts short.

zreplay waits in a few places by design: a rate-limited sample or add until the other
side catches up, a dataset until its buffer holds enough rows.  Such a wait may run on a
background thread (a :class:`~zreplay.api.prefetch.Prefetcher`'s) whose owner is
closed meanwhile, or on a thread of its own while another closes the buffer: either way
it must end at once, not when the limiter's timeout (perhaps ``None``: never) runs out.

Every such wait sleeps through :func:`pause`, which raises :class:`Interrupted` as soon
as the calling thread's stop event (installed by :func:`stopped_by`, what a prefetcher's
thread runs under) or one of the events passed in (a buffer's closing) is set.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

__all__ = ["Interrupted", "pause", "stopped_by"]

_SLICE_S = 0.02  # how often a wait on several events looks at each
_local = threading.local()


class Interrupted(Exception):
    """A wait was cut short by a ``close()``; the event that was set is ``event``."""

    def __init__(self, event: threading.Event):
        super().__init__("the wait was interrupted by close()")
        self.event = event


@contextlib.contextmanager
def stopped_by(event: threading.Event) -> Iterator[None]:
    """Within the block, every :func:`pause` of this thread ends (raising
    :class:`Interrupted`) once ``event`` is set."""
    previous = getattr(_local, "stop", None)
    _local.stop = event
    try:
        yield
    finally:
        _local.stop = previous


def pause(seconds: float, *events: threading.Event | None) -> None:
    """Sleep ``seconds``, or raise :class:`Interrupted` as soon as this thread's stop
    event or any of ``events`` is set (also when one is set already)."""
    watch = [e for e in (getattr(_local, "stop", None), *events) if e is not None]
    deadline = time.monotonic() + max(0.0, seconds)
    while True:
        for e in watch:
            if e.is_set():
                raise Interrupted(e)
        left = deadline - time.monotonic()
        if left <= 0:
            return
        if len(watch) == 1:
            watch[0].wait(left)
        elif watch:
            time.sleep(min(left, _SLICE_S))
        else:
            time.sleep(left)
