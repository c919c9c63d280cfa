"""Thread primitives that a Ctrl-C cannot break, and holding Ctrl-C back across a step
that must not be cut in two (publishing an in-memory change, importing a native module)."""

from __future__ import annotations

import contextlib
import importlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import ModuleType

try:  # the C functions signal.signal wraps: 0.2 us a call instead of 2.6 (no enum
    # conversions), on a path every add takes twice
    from _signal import signal as _set_handler
except ImportError:  # pragma: no cover - other interpreters
    _set_handler = signal.signal


class Deferral:
    """What :func:`deferred_interrupts` yields: :meth:`check` raises the held-back
    KeyboardInterrupt at once, where the block waits (it then is not raised again)."""

    __slots__ = ("got", "outer")  # made twice per add: kept light

    def __init__(self, outer: Deferral | None = None):
        self.got: list = []
        self.outer = outer  # the deferral this one is nested in (a SIGINT may be there)

    def _record(self, sig, frame) -> None:
        self.got.append(frame)

    def check(self) -> None:
        d, pending = self, False
        while d is not None:
            pending, d.got[:] = pending or bool(d.got), []
            d = d.outer
        if pending:
            raise KeyboardInterrupt


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[Deferral]:
    """Run the block with SIGINT held back; a SIGINT that arrived meanwhile is handed to
    the previous handler (raising KeyboardInterrupt by default) right after it, or
    raised where the block calls the yielded :meth:`Deferral.check` (in a wait).  Only
    the main thread receives signals: elsewhere the block just runs.

    What it is for: an exception between two assignments of a multi-part state change
    would leave it half done.  Everything that can fail (conversions, allocations,
    copies) runs before such a step; what remains are plain assignments, and the one
    exception that can still arrive between them is the KeyboardInterrupt of a SIGINT (a
    notebook user pressing Ctrl-C, who then goes on using the buffer): it is delivered
    after the step instead of in the middle of it."""
    if threading.current_thread() is not threading.main_thread():
        yield Deferral()
        return
    d = Deferral()
    try:
        old = _set_handler(signal.SIGINT, d._record)
    except (ValueError, TypeError):  # not the main interpreter, or no signal support
        yield d
        return
    outer = getattr(old, "__self__", None)
    d.outer = outer if isinstance(outer, Deferral) else None
    try:
        yield d
    finally:
        _set_handler(signal.SIGINT, old)
        if d.got and callable(old):
            old(signal.SIGINT, d.got[0])


def import_whole(name: str) -> ModuleType:
    """``import name`` with Ctrl-C held back until it is done (then raised).  A native
    module whose initialisation a KeyboardInterrupt cuts short fails with "ImportError:
    initialization failed", and some cannot be initialised twice in one process
    (TensorStore aborts it on the retry: "SetTimeZone() has already been called"), so a
    Ctrl-C at the first open must not land inside its import."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    with deferred_interrupts():
        return importlib.import_module(name)


class InterruptSafeCondition(type(threading.RLock())):
    """A condition variable over a reentrant lock whose ``with`` never leaks the lock.

    ``threading.Condition``'s ``__enter__`` and ``__exit__`` are Python functions around
    the lock's: CPython may run a SIGINT's handler right after the lock was taken and
    before ``__enter__`` returns (or before ``__exit__`` let it go), so a Ctrl-C there
    leaves the lock held by the interrupted thread for good (CPython issue 29988; 1 in
    a few hundred to a few thousand interrupts of a ``with cond:`` loop here), and the writer's background
    thread waits for it forever.  This condition *is* the lock (C ``__enter__`` and
    ``__exit__``, no Python frame between taking it and the protected block), with
    ``wait``/``notify_all`` of a ``threading.Condition`` over it."""

    def __init__(self):
        self._cond = threading.Condition(self)

    def wait(self, timeout: float | None = None) -> bool:
        return self._cond.wait(timeout)

    def notify_all(self) -> None:
        self._cond.notify_all()
