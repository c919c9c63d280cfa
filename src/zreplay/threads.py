"""Thread primitives that a Ctrl-C cannot break."""

from __future__ import annotations

import threading


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
