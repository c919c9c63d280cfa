"""Holding Ctrl-C back across the few statements that publish a change in memory.

An exception between two assignments of a multi-part state change would leave it half
done.  Everything that can fail (conversions, allocations, copies) runs before such a
step; what remains are plain assignments, and the one exception that can still arrive
between them is the KeyboardInterrupt of a SIGINT (a notebook user pressing Ctrl-C, who
then goes on using the buffer).  :func:`deferred_interrupts` delivers that one after the
step instead of in the middle of it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

try:  # the C functions signal.signal wraps: 0.2 us a call instead of 2.6 (no enum
    # conversions), on a path every add takes twice
    from _signal import signal as _set_handler
except ImportError:  # pragma: no cover - other interpreters
    _set_handler = signal.signal


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Run the block with SIGINT held back; a SIGINT that arrived meanwhile is handed to
    the previous handler (raising KeyboardInterrupt by default) right after it.  Only the
    main thread receives signals: elsewhere the block just runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list = []
    try:
        old = _set_handler(signal.SIGINT, lambda sig, frame: got.append(frame))
    except (ValueError, TypeError):  # not the main interpreter, or no signal support
        yield
        return
    try:
        yield
    finally:
        _set_handler(signal.SIGINT, old)
        if got and callable(old):
            old(signal.SIGINT, got[0])
