"""TorchRL's round-robin writers attached to a :class:`~zreplay.torchrl.ZarrStorage`.

The storage decides where the next row goes (its ring); TorchRL's writers keep their own
cursor and write count, in private fields with no public setter, and pass that cursor to
``storage.set``.  This module is the only code that reads or moves those fields: the
storage puts attached writers where its ring goes on (after a resume, a failed extend,
a loaded checkpoint) and learns from a restored writer where a full ring imported from a
TorchRL state dict goes on.
"""

from __future__ import annotations

import functools
import weakref

_FOLLOWED: weakref.WeakSet = weakref.WeakSet()  # writers whose load_state_dict we follow


class _FollowedLoad:
    """A writer's ``load_state_dict`` that then tells ``restored`` (a weak method of the
    storage, called with the writer) where the writer's cursor is; pickled, the writer
    gets its own method back."""

    def __init__(self, load, restored: weakref.WeakMethod):
        self._load, self._restored = load, restored

    def __call__(self, state_dict) -> None:
        self._load(state_dict)
        restored = self._restored()
        if restored is not None:
            restored(self._load.__self__)

    def __reduce__(self):
        writer = self._load.__self__
        return (functools.partial, (type(writer).load_state_dict, writer))


def follow(writer, restored) -> None:
    """Have ``writer``'s ``load_state_dict`` (which TorchRL's ``rb.load_state_dict``
    calls right after the storage's) call ``restored(writer)`` (a bound method of the
    storage, held weakly) once the writer's state is back."""
    if writer in _FOLLOWED:
        return
    writer.load_state_dict = _FollowedLoad(writer.load_state_dict, weakref.WeakMethod(restored))
    _FOLLOWED.add(writer)


def attached_writers(storage) -> list:
    """The writers of the replay buffers ``storage`` is attached to that write to it."""
    out = []
    for ent in storage._attached_entities:
        w = getattr(ent, "_writer", None)
        if w is not None and getattr(w, "_storage", None) is storage:
            out.append(w)
    return out


def known_cursor(writers) -> int | None:
    """The cursor of one of ``writers`` that was restored or has written (a fresh one
    knows nothing its storage does not); ``None`` if none has."""
    for w in writers:
        cursor, count = writer_position(w)
        if count:
            return cursor
    return None


def writer_position(writer) -> tuple[int, int]:
    """``(cursor, write_count)`` of a TorchRL writer."""
    return int(writer._cursor), int(writer._write_count)


def place_writer(writer, cursor: int, write_count: int) -> None:
    """Move a TorchRL writer to ``cursor`` with ``write_count`` rows written."""
    writer._cursor = cursor
    writer._write_count = write_count
