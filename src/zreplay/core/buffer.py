"""The buffer core: one engine, one bound sampler, one random stream; what facades call.

A :class:`BufferCore` is either writable (over a
:class:`~zreplay.engine.writer.SegmentWriter`: one writer's segment of a buffer, plus
in-process sampling of it) or read-only (over a
:class:`~zreplay.engine.reader.BufferReader`: the union of every segment, as
``zreplay.open`` gives).  Either way it draws with its sampler and random stream, reads
through the one gather, and returns flat ``{key path: numpy array}`` dicts; a facade
adds its nesting, tensors and names.  Writable cores save the stream's and the sampler's
state (priorities included) with every commit and resume them when reopened.

Everything a facade needs is a public method here; see CONTRIBUTING.md ("A facade").
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine import replace
from ..engine.prepared import Prepared
from ..engine.reader import BufferReader
from ..engine.writer import SegmentWriter
from ..errors import EmptyBufferError, HandoffError, ReadOnlyError
from ..index.episodes import EpisodeView
from ..numbers import as_int, as_optional_float
from ..samplers import Sampler, as_sampler
from ..sampling import plans
from ..sampling.clips import ClipSpec
from ..sampling.nstep import NStepSpec
from ..store.commit import VIEW_ROWS
from .bound_sampler import BoundSampler
from .guards import add_checked, new_writer
from .rate import RateGate, RateLimiter, check_rate_options
from .records import BATCH_BYTES, TrajectoryRecord, read_episodes, read_rows, read_trajectories
from .staging import staged_replacement
from .stream import RandomStream

__all__ = ["BufferCore", "Prepared", "TrajectoryRecord"]

log = logging.getLogger("zreplay")


class BufferCore:
    """A buffer's engine, sampler and random stream (see the module docstring).

    Construct with :meth:`writer` or :meth:`reader`.  ``owner`` is the facade object a
    sampler hook ``fn(step, buffer, batch_size, history_len)`` receives as ``buffer``.
    """

    def __init__(self, engine, sampler: Sampler, stream: RandomStream, owner: Any = None):
        self.engine = engine
        self.stream = stream
        # The facade, held weakly (it holds the core): a hook's ``buffer`` argument.
        self._owner_ref = weakref.ref(owner) if owner is not None else (lambda: self)
        self._bound = BoundSampler(as_sampler(sampler), self, self._owner)
        self._pid = os.getpid()
        self._is_reader = not engine.writable
        self.facade_state = dict(engine.commit.sampler.get("facade", {})) if engine.writable else {}
        self.rate: RateGate | None = None
        self._state_error: TypeError | None = None  # the writer could not save state()
        self._kept_state: dict | None = None  # keep_saved_state()
        # Views show only trajectories that start within this many newest rows (the
        # commit's sampler["view_rows"]; None: every visible row).  See view_low_traj.
        self.view_rows: int | None = None
        # Set by close(): a wait on this core's behalf (a rate limit, a dataset waiting for
        # rows) ends at once (zreplay.core.waits).
        self.closing = threading.Event()

    @property
    def _owner(self) -> Any:
        return self._owner_ref()

    def __repr__(self) -> str:
        kind = f"writer {self.engine.writer_id!r}" if self.writable else "read-only"
        return f"<zreplay buffer {self.path} ({kind})>"

    @classmethod
    def writer(
        cls,
        path,
        *,
        sampler=None,
        stream: RandomStream | None = None,
        owner=None,
        rate_limiter: RateLimiter | None = None,
        learner_id: str | None = None,
        **options,
    ) -> BufferCore:
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
            core.load_state(core.engine.commit.sampler)
            core.engine.attach(core)
            core.set_rate_limiter(rate_limiter, learner_id)
            if owner is not None:
                core.close_when_dropped(owner)
        except BaseException:
            if core is not None:
                core.close()
            elif engine is not None:
                engine.close()
            raise
        return core

    @classmethod
    def reader(
        cls, path, *, sampler=None, seed: int | None = None, owner=None, **options
    ) -> BufferCore:
        """A read-only core over every segment of the buffer at ``path``; ``options``
        are :class:`~zreplay.engine.reader.BufferReader`'s (storage_options,
        column_cache_bytes, chunk_cache_bytes)."""
        sampler = as_sampler(sampler)
        BoundSampler.check(sampler)  # before the store is opened
        core = cls(BufferReader(path, **options), sampler, RandomStream(seed), owner)
        if owner is not None:
            core.close_when_dropped(owner)  # a learner's progress file says it stopped
        return core

    @property
    def writable(self) -> bool:
        return self.engine.writable

    @property
    def path(self):
        return self.engine.path

    @property
    def temporary(self) -> bool:
        """A private temporary store (deleted on close)."""
        return self.writable and self.engine.temporary

    def handoff(
        self,
        facade: str,
        to: str,
        path_arg: str = "path",
        allow_temporary: bool = False,
        sampler: bool = True,
    ) -> Handoff:
        """What every facade pickles as, the one way a buffer crosses a process boundary:
        its location, storage options and sampler configuration, no data, for the other
        side to reopen read-only (``to`` names what it gets there).  A writer commits
        everything added first, so the other side sees it.  A private temporary store is
        refused (:class:`~zreplay.errors.HandoffError`, naming ``path_arg``) unless
        ``allow_temporary`` (DataLoader workers, which die with this process).
        ``sampler=False``: the other side does not sample (no copy of the sampler is
        made; ``Handoff.sampler`` is None)."""
        if self.writable and self.temporary and not allow_temporary:
            raise HandoffError(
                f"a {facade} on a private temporary store cannot be handed to another "
                f"process (it would get {to}); construct it with {path_arg}= (a "
                "directory or s3:// URL)"
            )
        if self.writable:
            self.flush()
        copy = self.sampler.unbound_copy() if sampler else None
        return Handoff(str(self.path), self.storage_options, copy)

    @property
    def storage_options(self) -> dict:
        return self.engine.path.backend.storage_options

    @property
    def schema(self):
        return self.engine.schema

    @property
    def keys(self) -> list[str]:
        schema = self.engine.schema
        return [] if schema is None else list(schema.keys)

    @property
    def num_rows(self) -> int:
        """Visible transitions (rows)."""
        return self.engine.num_rows

    @property
    def row_range(self) -> tuple[int, int]:  # (first, stop) of visible rows() positions
        return self.engine.locked(lambda s: (int(s.bounds[0]), int(s.bounds[0]) + s.num_rows))

    @property
    def num_trajectories(self) -> int:
        return self.engine.num_trajectories

    @property
    def next_trajectory_id(self) -> int:
        return self.engine.next_trajectory_id

    def episodes(self) -> EpisodeView:
        """The visible episodes (per-episode lengths, flags; ``(episode, step) -> row``)."""
        self._check_process()
        return self.engine.episodes()

    @property
    def num_episodes(self) -> int:
        return len(self.episodes())

    def episode_table(self) -> dict[str, np.ndarray]:
        """Per-episode columns (episode id, length, first_step, terminated, truncated)."""
        return plans.episode_table(self.episodes())

    def stats(self) -> dict:
        return self._writer().stats()

    @property
    def closed(self) -> bool:
        return self.engine.closed

    @property
    def sampler(self) -> Sampler:
        return self._bound.sampler

    def set_sampler(self, sampler) -> None:
        """Draw with ``sampler`` from now on (a sampler, hook or None for uniform)."""
        self._bound = BoundSampler(as_sampler(sampler), self, self._owner)

    def set_rate_limiter(self, limiter: RateLimiter | None, learner_id: str | None = None):
        """Rate-limit this core's samples (and a writer's adds) with ``limiter`` (see
        :mod:`zreplay.core.rate`); ``learner_id`` declares it a learner that publishes
        its sample count (resumed from its progress file)."""
        check_rate_options(limiter, learner_id)
        self.rate = None if limiter is None else RateGate(limiter, self, learner_id)

    def update_priorities(self, indices, priorities) -> int:
        """Set the priorities of what a batch drew (``batch["index"]``); returns how many
        were applied (rows evicted since they were drawn are skipped)."""
        return self.engine.locked(
            lambda snap: self._bound.update_priorities(snap.space, indices, priorities)
        )

    def priorities(self, indices) -> np.ndarray:
        """Tree leaves (float64) of ``indices`` (0 for rows no longer or not yet visible)."""
        return self.engine.locked(lambda snap: self._bound.priorities(snap.space, indices))

    def _check_process(self) -> None:
        # A reader handed to another process (DataLoader workers) reopens there, and must
        # not replay its parent's draws.
        if self._is_reader and os.getpid() != self._pid:
            self._pid = os.getpid()
            self.stream.unseeded()
            self.engine.check_process()

    def read(
        self, draw: Callable[[Any], object], alloc=None, redraw: bool = True
    ) -> tuple[object, dict]:
        """``draw(snapshot)`` at one consistent instant, then gather what it asks for (see
        ``SegmentWriter.read``); returns ``(what draw returned, {name: array})``.
        ``redraw=False``: ``draw`` reads positions the caller chose, which a reader never
        re-resolves on a refreshed snapshot (``StaleViewError`` if its rows went)."""
        self._check_process()
        return self.engine.read(draw, alloc, redraw)

    def _read(self, fn) -> dict:
        return self.read(fn)[1]

    def _read_at(self, draw, alloc=None) -> tuple[object, dict]:
        # Positions the caller chose (an index, an episode, a trajectory) mean rows of
        # the snapshot it counted them in: never drawn again on another one.
        return self.read(draw, alloc, redraw=False)

    def _read_fixed(self, fn) -> dict:
        return self._read_at(fn)[1]

    def pick(self, n: int, step: int | None = None, version=None):
        """The sampler's ``pick(units, snapshot)`` for ``n`` units (the stream's step is
        taken now unless ``step`` is given); ``version``: the caller's policy version."""
        n = as_int(n, "the number of samples", minimum=1)
        version = as_optional_float(version, "version")
        step = None if step is None else as_int(step, "step")
        if self.rate is not None:  # a rate-limited learner waits (and counts them once read)
            self.rate.before_sample(n)
        step = self.stream.take_step(step)
        return self._bound.pick(self.stream.rng, n, step, version)

    def _counted(self, n: int, out: dict) -> dict:
        """A rate-limited learner counts ``n`` units once they were read."""
        if self.rate is not None:
            self.rate.sampled(n)
        return out

    def sample(
        self, n: int, keys: list[str] | None = None, alloc=None, version=None
    ) -> dict[str, np.ndarray]:
        """``n`` rows drawn by the sampler (flat dict; ``index``/``weight`` beside the data
        for a prioritized sampler), or ``n`` clips for a sampler with a clip shape.
        ``alloc(name, shape, dtype)`` provides each data output (rows only); ``version``:
        the policy version now trained (``Staleness`` weighs rows by it)."""
        n = as_int(n, "the number of samples", minimum=1)
        version = as_optional_float(version, "version")
        clips = self._bound.sampler.clips
        if clips is not None:
            return self.sample_clips(clips, n, keys, version=version)
        if self.rate is not None:
            self.rate.before_sample(n)
        extra: dict = {}
        box: dict = {}

        def draw(snap):
            if snap.num_rows <= 0:
                raise EmptyBufferError(self.engine.empty_message())
            if "step" not in box:  # a view's retry draws again with the same step
                box["step"] = self.stream.take_step()
            rows, got = self._bound.draw_rows(self.stream.rng, snap, n, box["step"], version)
            extra.clear()
            extra.update(got)
            return rows if keys is None else {k: (k, rows) for k in keys}

        _, out = self.read(draw, alloc)  # a retried read draws again: counted once, after
        self.stream.num_sampled += n
        return self._counted(n, plans.add_extra(out, extra))

    def sample_clips(
        self, spec: ClipSpec, n: int, keys: list[str] | None = None, step=None, version=None
    ) -> dict[str, np.ndarray]:
        """``n`` clips ``{key: [n, history_len, ...]}`` drawn by the sampler over every
        valid clip (``is_pad`` with padding; ``index``/``weight`` when prioritized)."""
        pick = self.pick(n, step, version)
        return self._counted(n, plans.gather_clips(self._read, spec, keys or self.keys, pick))

    def clips(self, spec: ClipSpec, indices, keys: list[str] | None = None) -> dict:
        """Clips at flat clip indices ``[0, spec.num_clips(episodes))``."""
        return plans.gather_clips(self._read_fixed, spec, keys or self.keys, plans.fixed(indices))

    def num_clips(self, spec: ClipSpec) -> int:
        return spec.num_clips(self.episodes())

    def sample_nstep(
        self, spec: NStepSpec, n: int, keys: list[str] | None = None, step=None, version=None
    ) -> dict[str, np.ndarray]:
        """``n`` n-step transitions (see :func:`zreplay.sampling.plans.gather_nstep`)."""
        pick = self.pick(n, step, version)
        return self._counted(n, plans.gather_nstep(self._read, spec, self.keys, pick, keys))

    def episode(self, e: int, keys=None, start: int = 0, stop=None) -> dict[str, np.ndarray]:
        """Visible steps ``[start, stop)`` (default all) of episode ``e`` as arrays."""
        e, start = as_int(e, "episode"), as_int(start, "start")
        stop = None if stop is None else as_int(stop, "stop")
        return plans.gather_episode(self._read_fixed, keys or self.keys, e, start, stop)

    def rows(self, positions, keys: list[str] | None = None) -> dict[str, np.ndarray]:
        """Rows at visible positions (``[0, num_rows)`` for a reader, global rows for a
        writer)."""
        return read_rows(self._read_at, self.keys if keys is None else list(keys), positions)

    def trajectory(self, i: int, keys: list[str] | None = None) -> TrajectoryRecord:
        """Visible trajectory ``i`` (0 = oldest kept; negative from the newest)."""
        i = as_int(i, "trajectory")
        keys = self.keys if keys is None else list(keys)
        return next(read_trajectories(self._read_at, self.schema, keys, i, i + 1, 0))

    def trajectories(
        self, start: int = 0, stop: int | None = None, batch_bytes: int = BATCH_BYTES
    ) -> Iterator[TrajectoryRecord]:
        """Visible trajectories ``[start, stop)``, oldest first, read ``batch_bytes`` of
        rows at a time (one range read per key and batch)."""
        stop = self.num_trajectories if stop is None else stop
        yield from read_trajectories(
            self._read_at, self.schema, self.keys, start, stop, batch_bytes
        )

    def episodes_from(
        self, start: int, keys: list[str] | None = None, batch_bytes: int = BATCH_BYTES
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Episodes from ``start`` on, as many as fit ``batch_bytes`` (at least one), read
        together: ``(columns [steps, ...], {"length", "terminated", "truncated"})``."""
        return read_episodes(self._read_at, self.schema, keys or self.keys, start, batch_bytes)

    def refresh(self) -> bool:
        """A reader re-reads the commits (True if anything new became visible)."""
        self._check_process()
        return self.engine.refresh() if not self.writable else False

    def stale(self) -> bool:
        """A reader: has a writer committed since its last refresh (cheap: a ``stat`` per
        segment)?  A writer reads its live state: never."""
        self._check_process()
        return False if self.writable else self.engine.stale()

    def segments(self) -> list[tuple[str, Any]]:
        """``(writer_id, commit)`` of every visible segment (readers)."""
        return self._reader().segments()

    def commits(self) -> list[tuple[str, Any]]:
        """``(writer_id, commit)`` of every committed segment, empty ones (cleared, or
        all evicted) included (readers)."""
        return self._reader().commits()

    @property
    def last_commit(self):
        """What this writer last committed (after :meth:`flush`: everything added)."""
        return self._writer().commit

    # -- writing (writable cores) ----------------------------------------------------

    def _writer(self) -> SegmentWriter:
        if not self.writable:
            raise ReadOnlyError(f"{self.path} is open read-only (zreplay.open); use a buffer")
        return self.engine

    def _reader(self) -> BufferReader:
        if self.writable:
            raise TypeError("segments() lists the segments of a read-only core")
        return self.engine

    def add(self, items: list[Prepared]) -> list[int]:
        """Validate, then append trajectories (all or none pass); returns their ids (-1
        for a stale one a full buffer dropped: ``Staleness(evict_stale=True)``).  With a
        rate limiter, first waits until the rows do not run ahead of the learners."""
        eng = self._writer()
        eng.validate(items)  # a malformed batch is refused whole, whatever would be dropped
        if self.rate is not None:
            self.rate.before_insert(sum(it.n_rows for it in items))
        cap = eng.state.capacity
        free = None if cap is None else cap - eng.num_rows
        keep = self._bound.admit(items, free)
        ids = iter(add_checked(eng, [it for it, k in zip(items, keep, strict=True) if k]))
        out = [next(ids) if k else -1 for k in keep]
        self._bound.admitted(items, keep)
        return out

    def set_capacity(self, capacity: int) -> None:
        """See :meth:`~zreplay.engine.writer.SegmentWriter.set_capacity`."""
        self._writer().set_capacity(capacity)

    def reserve_trajectory_ids(self, stop: int) -> None:
        self._writer().reserve_trajectory_ids(stop)

    def flush(self) -> None:
        """Block until everything added is committed (with the sampler state)."""
        if self.writable:
            self.engine.flush()
            error, self._state_error = self._state_error, None
            if error is not None:
                raise TypeError(
                    f"everything added is committed, but not the sampler state: {error}. "
                    "The buffer keeps the last sampler state it saved until that is fixed"
                ) from None

    def clear(self) -> None:
        """Remove every trajectory (on disk too) in one commit; rows, ids and the random
        stream go on (nothing is ever reused)."""
        self._writer().clear()

    def drop_ram(self) -> None:
        self._writer().drop_ram()

    def checkpoint(self, dest) -> None:
        self._writer().checkpoint(dest)

    def adopt(self, src, writer_id: str, first: int, stop: int, state: Mapping) -> None:
        """Replace this buffer's contents with trajectories ``[first, stop)`` of segment
        ``writer_id`` of the buffer at ``src`` by hard-linking its files (no data copy),
        all or nothing, taking ``state`` (a commit's sampler state) as this buffer's
        stream and sampler state.  A restore: rows, trajectory ids and saved priorities
        are the source's (indices drawn before it do not apply after it)."""
        writer = self._writer()
        before = writer.commit.contents
        try:
            replace.adopt(writer, src, writer_id, first, stop, dict(state))
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
        return staged_replacement(self, self._writer(), state)

    def close_when_dropped(self, owner: Any) -> None:
        """Once ``owner`` (the facade) is garbage collected, close this core: what was
        added is committed and the writer lock released, for every facade alike (a
        notebook cell run again after ``del buf`` reopens the path)."""
        weakref.finalize(owner, _close_dropped, self)

    def close(self) -> None:
        """Close the writer (commit, unlock); a rate-limited learner publishes that it
        stopped; waits on this core's behalf in other threads end."""
        self.closing.set()
        if self.rate is not None:
            self.rate.close()
        if self.writable:
            self.engine.close()

    def load_state(self, state: Mapping | None) -> bool:
        """Resume a saved stream (and the sampler's state with it); True if it did."""
        if not self.stream.load(state):
            return False
        self._bound.load_state(state)
        return True

    def reseed(self, seed: int, rank: int | None = None) -> None:
        """Restart the random stream (``rank``: that rank's own stream)."""
        self.stream.reseed(seed, rank)

    def full_state(self) -> dict:
        """The stream and sampler state, priorities as arrays (for ``torch.save``)."""
        out = self.stream.state()
        out.update(self.engine.locked(lambda snap: self._bound.full_state(snap.space)))
        return out

    def load_full_state(self, state: Mapping) -> None:
        self.stream.load(state)
        self.engine.locked(lambda snap: self._bound.load_full_state(state, lambda: snap.space))

    # The writer's StateSource: what it saves with every commit.

    @property
    def keeps_priorities(self) -> bool:
        return self._bound.prioritized

    def state(self) -> dict:
        if self._kept_state is not None:
            return dict(self._kept_state)
        out = {**self.stream.state(), **self._bound.state(), "facade": dict(self.facade_state)}
        if self.view_rows is not None:
            out[VIEW_ROWS] = self.view_rows
        return out

    def keep_saved_state(self) -> None:
        """Commit the state the segment was opened with, unchanged (random stream,
        sampler, saved priorities, facade state), whatever this core draws: for a
        writer that only appends rows to a buffer another facade owns (a dump with
        ``mode="append"``)."""
        self._kept_state = dict(self.engine.commit.sampler or {})

    def priorities_to_save(self, n_rows: int, explicit: bool):
        space = self.engine.snapshot().space  # the writer holds its lock while it asks
        return self._bound.priorities_to_save(space, n_rows, explicit)

    def save_failed(self) -> None:
        self._bound.save_failed()

    def state_failed(self, error: TypeError) -> None:
        log.error("zreplay: the sampler state was not saved with a commit: %s", error)
        self._state_error = error


@dataclass(frozen=True)
class Handoff:
    """A buffer as it crosses a process boundary (:meth:`BufferCore.handoff`)."""

    path: str
    storage_options: Mapping | None
    sampler: Sampler | None


def _close_dropped(core: BufferCore) -> None:
    """A facade was collected: close its core on a thread of its own.  The collection
    may run on any thread, inside whatever locks it holds, where closing could wait on
    itself: the writer's committer, a thread inside the writer's lock, the S3 client's
    event loop, a server in this process that the close's requests go to.  Until a
    writer has let go of its lock, a new writer of the segment in this process waits for
    it (``WriterLock.releasing``); until a learner view has published that it stopped, a
    learner declared again under its name waits for it (``RateGate.closing_soon``).  So
    ``del buf`` then opening the path again works as if close() had been called."""
    if core.closed:
        return
    if core.writable:
        core.engine.closing_soon()
    elif core.rate is not None:
        core.rate.closing_soon()
    threading.Thread(target=_close_quietly, args=(core,), name="zreplay-close").start()


def _close_quietly(core: BufferCore) -> None:
    try:
        core.close()
    except Exception as e:  # noqa: BLE001 - nobody is left to raise it to
        log.error("zreplay: closing %s after it was dropped failed: %r", core.path, e)
