"""The writable core: one writer's segment, sampled in this process, and changed.

:class:`WritableCore` adds to the read side (:class:`~zreplay.core.buffer.BufferCore`)
what only a writer does: add (with its rate limit and sampler admission), flush (with the
sampler state's errors), replacing the contents (a loaded checkpoint, a staged
replacement) and the state committed beside the rows.  What its writer does alone
(clear, checkpoint, capacity, the RAM tier, ids, stats, the last commit) a caller asks
the writer (``core.engine``, a :class:`~zreplay.engine.writer.SegmentWriter`) for.  The state its writer commits beside the rows
(random stream, sampler, facade state) is a :class:`~zreplay.core.saved.SavedState` the
writer holds, not this core: the committer thread never calls back into it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..engine import replace
from ..engine.prepared import Prepared
from ..engine.writer import SegmentWriter
from ..errors import HandoffError
from ..samplers import as_sampler
from .bound_sampler import BoundSampler
from .buffer import BufferCore, Handoff
from .guards import add_checked, new_writer
from .rate import RateLimiter
from .records import read_global_rows
from .saved import SavedState
from .staging import staged_replacement
from .stream import RandomStream


class WritableCore(BufferCore, kind="writer"):
    """A :class:`BufferCore` over a :class:`~zreplay.engine.writer.SegmentWriter`
    (``engine``); made by :meth:`BufferCore.writer`."""

    writable = True
    engine: SegmentWriter

    def __init__(self, engine: SegmentWriter, sampler, stream: RandomStream, owner: Any = None):
        super().__init__(engine, sampler, stream, owner)
        self.saved = SavedState(stream, self._bound, engine.commit.sampler.get("facade", {}))

    @classmethod
    def open(
        cls,
        path,
        *,
        sampler=None,
        stream: RandomStream | None = None,
        owner=None,
        rate_limiter: RateLimiter | None = None,
        learner_id: str | None = None,
        **options,
    ) -> WritableCore:
        """A writable core on segment ``options["writer_id"]`` of the buffer at ``path``
        (``None``: a private temporary store); ``options`` are
        :class:`~zreplay.engine.writer.SegmentWriter`'s (capacity, ram, layout, durable,
        overwrite, break_lock, storage_options, staging_bytes).  Resumes the stream and
        sampler state saved with the segment's last commit; ``rate_limiter`` and
        ``learner_id``: :meth:`set_rate_limiter`."""
        sampler = as_sampler(sampler)
        BoundSampler.check(sampler)  # before anything is made on disk
        engine = core = None
        try:  # the writer made, everything up to its owner's finalizer: nothing orphaned
            engine = new_writer(path, options)
            core = cls(engine, sampler, stream or RandomStream(), owner)
            core.load_state(engine.commit.sampler)
            engine.attach(core.saved)
            core.set_rate_limiter(rate_limiter, learner_id)
        except BaseException:
            if core is not None:
                core.close()
            elif engine is not None:
                engine.close()
            raise
        return core

    def __repr__(self) -> str:
        return f"<zreplay buffer {self.path} (writer {self.engine.writer_id!r})>"

    def handoff(
        self,
        facade: str,
        to: str,
        path_arg: str = "path",
        allow_temporary: bool = False,
        sampler: bool = True,
    ) -> Handoff:
        if self.engine.temporary and not allow_temporary:
            raise HandoffError(
                f"a {facade} on a private temporary store cannot be handed to another "
                f"process (it would get {to}); construct it with {path_arg}= (a "
                "directory or s3:// URL)"
            )
        self.flush()
        return super().handoff(facade, to, path_arg, allow_temporary, sampler)

    handoff.__doc__ = BufferCore.handoff.__doc__

    def load_state(self, state: Mapping | None) -> bool:
        """Resume a saved stream (and the sampler's state with it); True if it did."""
        if not self.stream.load(state):
            return False
        self._bound.load_state(state)
        return True

    def set_sampler(self, sampler) -> None:
        super().set_sampler(sampler)
        self.saved.bound = self._bound  # its state is what the writer commits from now on

    # -- what the writer commits beside the rows --------------------------------------

    @property
    def facade_state(self) -> dict:
        """The facade's JSON state, committed as ``commit.sampler["facade"]`` (changed in
        place, or replaced whole)."""
        return self.saved.facade

    @facade_state.setter
    def facade_state(self, state: dict) -> None:
        self.saved.facade = state

    @property
    def view_rows(self) -> int | None:
        """Views show only trajectories that start within this many newest rows (the
        commit's ``sampler["view_rows"]``; None: every visible row)."""
        return self.saved.view_rows

    @view_rows.setter
    def view_rows(self, rows: int | None) -> None:
        self.saved.view_rows = rows

    def keep_saved_state(self) -> None:
        """Commit the state the segment was opened with, unchanged (random stream,
        sampler, saved priorities, facade state), whatever this core draws: for a
        writer that only appends rows to a buffer another facade owns (a dump with
        ``mode="append"``)."""
        self.saved.keep(self.engine.commit.sampler)

    # -- global rows ----------------------------------------------------------------

    @property
    def next_row(self) -> int:
        """The global row the next added row gets (one past the newest visible one);
        global rows are never reused, so they name a row for good (TorchRL's ring)."""
        return self.engine.locked(lambda snap: int(snap.parts[0].n_rows))

    def read_global_rows(self, rows, keys: list[str] | None = None) -> dict[str, np.ndarray]:
        """Rows at global ``rows`` of this segment (int64, any shape; read flat) rather
        than positions: located in the snapshot the read takes, so no eviction comes
        between.  ``IndexError`` for a row not visible now (evicted, not added yet)."""
        return read_global_rows(self._read_at, self.keys if keys is None else list(keys), rows)

    # -- writing --------------------------------------------------------------------

    def add(self, items: list[Prepared]) -> list[int]:
        """Validate, then append trajectories (all or none pass); returns their ids (-1
        for a stale one a full buffer dropped: ``Staleness(evict_stale=True)``).  With a
        rate limiter, first waits until the rows do not run ahead of the learners."""
        eng = self.engine
        eng.validate(items)  # a malformed batch is refused whole, whatever would be dropped
        if self.rate is not None:
            self.rate.before_insert(sum(it.n_rows for it in items))
        cap = eng.state.capacity
        free = None if cap is None else cap - eng.own_rows
        keep = self._bound.admit(items, free)
        ids = iter(add_checked(eng, [it for it, k in zip(items, keep, strict=True) if k]))
        out = [next(ids) if k else -1 for k in keep]
        self._bound.admitted(items, keep)
        return out

    def flush(self) -> None:
        """Block until everything added is committed (with the sampler state)."""
        self.engine.flush()
        error = self.saved.take_error()
        if error is not None:
            raise TypeError(
                f"everything added is committed, but not the sampler state: {error}. "
                "The buffer keeps the last sampler state it saved until that is fixed"
            ) from None

    def adopt(self, src, writer_id: str, first: int, stop: int, state: Mapping) -> None:
        """Replace this buffer's contents with trajectories ``[first, stop)`` of segment
        ``writer_id`` of the buffer at ``src`` by hard-linking its files (no data copy),
        all or nothing, taking ``state`` (a commit's sampler state) as this buffer's
        stream and sampler state.  A restore: rows, trajectory ids and saved priorities
        are the source's (indices drawn before it do not apply after it)."""
        before = self.engine.commit.contents
        try:
            replace.adopt(self.engine, src, writer_id, first, stop, dict(state))
        except BaseException:
            self.follow_replaced(before)  # past its point of no return, it did replace
            raise
        self.load_state(state)

    def follow_replaced(self, contents_before: str) -> None:
        """After a replacement that raised: if the segment's contents did change (it
        failed past its point of no return, and the writer read the new commit back),
        take the stream, sampler and facade state that commit carries, so that nothing
        of the old contents' state is committed over the new rows later."""
        eng = self.engine
        if eng.closed or eng.commit.contents == contents_before:
            return
        state = dict(eng.commit.sampler or {})
        self.load_state(state)
        self.facade_state = dict(state.get("facade", {}))

    def replacing(self, state: Mapping | None = None):
        """A context manager: replace this buffer's contents with what the block adds to
        the yielded core (a staging buffer whose rows and ids go on from this one's), all
        or nothing: swapped in when the block ends, discarded if it raises.  ``state``:
        the stream and sampler state to resume afterwards (default: this buffer's then)."""
        return staged_replacement(self, self.engine, state)

    def _closing_soon(self) -> None:
        super()._closing_soon()  # a learner's name: waited for too
        self.engine.closing_soon()  # the writer lock
