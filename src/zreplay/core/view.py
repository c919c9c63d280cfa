"""The core of a read-only view: every segment of a buffer, as of its last refresh.

:class:`ViewCore` adds to the read side (:class:`~zreplay.core.buffer.BufferCore`) what
only a view has: its reopening in a process it was handed to.  Which segments it shows
and the segment rows that outlive a refresh are its engine's
(:class:`~zreplay.engine.reader.BufferReader`: ``segments()``, ``commits()``,
``segment_rows()``, ``positions_of()``), read as ``core.engine``.  It has no ``add``: a
view never writes.
"""

from __future__ import annotations

from typing import Any

from ..engine.reader import BufferReader
from ..forks import Origin
from ..samplers import as_sampler
from .bound_sampler import BoundSampler
from .buffer import BufferCore
from .stream import RandomStream


class ViewCore(BufferCore, kind="reader"):
    """A :class:`BufferCore` over a :class:`~zreplay.engine.reader.BufferReader`
    (``engine``); made by :meth:`BufferCore.reader`."""

    engine: BufferReader

    def __init__(self, engine: BufferReader, sampler, stream: RandomStream, owner: Any = None):
        super().__init__(engine, sampler, stream, owner)
        self._origin = Origin()  # a forked child reopens (check_process)
        self.facade_state: dict = {}  # a view commits nothing
        self.view_rows: int | None = None

    @classmethod
    def open(cls, path, *, sampler=None, seed: int | None = None, owner=None, **options):
        """A read-only core over every segment of the buffer at ``path``; ``options``
        are :class:`~zreplay.engine.reader.BufferReader`'s (storage_options,
        column_cache_bytes, chunk_cache_bytes)."""
        sampler = as_sampler(sampler)
        BoundSampler.check(sampler)  # before the store is opened
        return cls(BufferReader(path, **options), sampler, RandomStream(seed), owner)

    def _check_process(self) -> None:
        # A reader handed to another process (DataLoader workers) reopens there, and must
        # not replay its parent's draws.
        if self._origin.inherited:
            self._origin = Origin()
            self.stream.unseeded()
            self.engine.check_process()
