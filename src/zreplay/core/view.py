"""The core of a read-only view: every segment of a buffer, as of its last refresh.

:class:`ViewCore` adds to the read side (:class:`~zreplay.core.buffer.BufferCore`) what
only a view has: which segments it shows (:meth:`~ViewCore.segments`,
:meth:`~ViewCore.commits`), segment rows that outlive a refresh
(:meth:`~ViewCore.segment_rows`, :meth:`~ViewCore.positions_of`), and its reopening in a
process it was handed to.  It has no ``add``: a view never writes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

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
        core = cls(BufferReader(path, **options), sampler, RandomStream(seed), owner)
        if owner is not None:
            core.close_when_dropped(owner)  # a learner's progress file says it stopped
        return core

    def _check_process(self) -> None:
        # A reader handed to another process (DataLoader workers) reopens there, and must
        # not replay its parent's draws.
        if self._origin.inherited:
            self._origin = Origin()
            self.stream.unseeded()
            self.engine.check_process()

    @property
    def writer_ids(self) -> list[str]:
        """The visible segments' writer ids, in name order."""
        return self.engine.writer_ids

    def segments(self) -> list[tuple[str, Any]]:
        """``(writer_id, commit)`` of every visible segment."""
        return self.engine.segments()

    def commits(self) -> list[tuple[str, Any]]:
        """``(writer_id, commit)`` of every committed segment, empty ones (cleared, or
        all evicted) included."""
        return self.engine.commits()

    def segment_rows(self, start: int = 0, stop: int | None = None) -> list[tuple[str, int, int]]:
        """Visible trajectories ``[start, stop)`` as ``(writer_id, first_row, stop_row)``
        per segment (see :meth:`~zreplay.engine.reader.BufferReader.segment_rows`)."""
        return self.engine.segment_rows(start, stop)

    def positions_of(self, writer_id: str, rows) -> np.ndarray:
        """Current positions of rows of segment ``writer_id`` (IndexError if any is not
        visible)."""
        return self.engine.positions_of(writer_id, rows)
