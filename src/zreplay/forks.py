"""What a forked child does with its parent's per-process resources: one registry, run
once in the child right after ``fork``, instead of a pid check on every call.

A child of ``os.fork`` (multiprocessing's 'fork' context, DataLoader workers under it,
children of a forkserver) starts with a copy of its parent's memory but only the thread
that forked: the parent's threads, the locks they held, open file descriptions shared
with the parent (and the flocks on them), TensorStore contexts and obstore runtimes do
not carry over usefully, and some abort or hang when touched.  What holds such things
registers here:

* :func:`on_fork` ``(obj, reset)``: ``reset(obj)`` runs in each forked child while
  ``obj`` lives.  ``obj`` is held weakly: the registry never keeps it alive, and a
  collected object's reset never runs.
* :func:`at_fork` ``(child, before=, parent=)``: module-level state (a thread pool, an
  event loop, a set of fds), as ``os.register_at_fork`` takes it.
* :class:`Origin`: which process made an object.  ``origin.inherited`` turns True in a
  forked child (for what must keep meaning "not ours" there: a writer's lock and
  segment stay its parent's; a reader reopens lazily at its next use).

Resets run in the child's only thread, before it returns from ``fork``; they only
assign (forget an fd, a thread, a lock; mark a flag): no I/O, nothing that can block.  A
lock a reset replaces may have been held by another parent thread at the fork, so a
reset never takes it.  The registry itself takes no lock: registering is a single dict
assignment, atomic under the GIL, so a fork can never find it half done.  Nested forks
run every reset registered in the ancestors (the registry is inherited with the rest
of memory); objects made after a fork register in the process that made them.  Spawned
processes start afresh: nothing to do there.
"""

from __future__ import annotations

import itertools
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

from .threads import deferred_interrupts

__all__ = ["Origin", "at_fork", "forked", "on_fork"]

_FORKED = False
# key -> (weak reference to the object, its reset); keys in registration order.
_OBJECTS: dict[int, tuple[weakref.ref, Callable[[Any], None]]] = {}
_KEYS = itertools.count()
_CHILD: list[Callable[[], None]] = []
_BEFORE: list[Callable[[], None]] = []
_PARENT: list[Callable[[], None]] = []


def forked() -> bool:
    """True in a process forked from one that had imported zreplay (at any depth)."""
    return _FORKED


def at_fork(
    child: Callable[[], None],
    *,
    before: Callable[[], None] | None = None,
    parent: Callable[[], None] | None = None,
) -> None:
    """Run ``child()`` in each forked child (after every earlier registration's);
    ``before()`` in the forking thread just before a fork (in reverse order of
    registration) and ``parent()`` in the parent just after it, as
    ``os.register_at_fork`` does.  For module-level state; the functions are kept."""
    if before is not None:
        _BEFORE.append(before)
    if parent is not None:
        _PARENT.append(parent)
    _CHILD.append(child)


def on_fork(obj: Any, reset: Callable[[Any], None]) -> None:
    """Call ``reset(obj)`` in each forked child while ``obj`` lives (weakly held).

    ``reset`` must not hold ``obj`` itself (pass ``type(obj).method``, not the bound
    method), or ``obj`` could never be collected: ``TypeError`` for a method bound to
    ``obj``."""
    if getattr(reset, "__self__", None) is obj:
        raise TypeError(
            "on_fork(obj, reset): reset is a method bound to obj, which would keep obj "
            "alive for good; pass the function (type(obj).method) instead"
        )
    key = next(_KEYS)
    ref = weakref.ref(obj, lambda _r, key=key: _OBJECTS.pop(key, None))
    _OBJECTS[key] = (ref, reset)


class Origin:
    """Which process made its holder: :attr:`pid` is that process's pid, and
    :attr:`inherited` turns True (once, right after the fork) in every process forked
    from it.  Make a new one where the holder becomes this process's own.  Pickled, it
    is made afresh on the other side (an unpickled object is its new process's own)."""

    __slots__ = ("pid", "inherited", "__weakref__")

    def __init__(self):
        self.pid = os.getpid()
        self.inherited = False
        on_fork(self, Origin._mark)

    def _mark(self) -> None:
        self.inherited = True

    def __reduce__(self):
        return (Origin, ())

    def __repr__(self) -> str:
        return f"Origin(pid={self.pid}, inherited={self.inherited})"


def _run(hooks) -> None:
    for fn in hooks:
        _call(fn)


def _call(fn, *args) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - one reset's failure must not skip the others
        sys.unraisablehook(_Unraisable(*sys.exc_info(), f"zreplay fork hook {fn!r}"))


class _Unraisable:
    """The argument ``sys.unraisablehook`` takes (its type is not constructible)."""

    def __init__(self, exc_type, exc_value, exc_traceback, err_msg):
        self.exc_type, self.exc_value, self.exc_traceback = exc_type, exc_value, exc_traceback
        self.err_msg, self.object = err_msg, None


def _before() -> None:
    _run(reversed(_BEFORE))


def _after_in_parent() -> None:
    _run(_PARENT)


def _after_in_child() -> None:
    global _FORKED
    # Ctrl-C held back: a reset cut in two would leave an object half its parent's.
    with deferred_interrupts():
        _FORKED = True
        _run(_CHILD)
        for ref, reset in list(_OBJECTS.values()):
            obj = ref()
            if obj is not None:
                _call(reset, obj)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before, after_in_parent=_after_in_parent, after_in_child=_after_in_child
    )
