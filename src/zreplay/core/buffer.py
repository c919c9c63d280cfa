"""The buffer core's read side: one engine, one bound sampler, one random stream.

:class:`BufferCore` reads any :class:`~zreplay.engine.protocol.Engine`: it draws with its
sampler and random stream, reads through the one gather, and returns flat ``{key path:
numpy array}`` dicts; a facade adds its nesting, tensors and names.  Its two kinds say by
their type what they can do:

* :class:`~zreplay.core.writable.WritableCore` (:meth:`BufferCore.writer`), over a
  :class:`~zreplay.engine.writer.SegmentWriter`: one writer's segment, sampled in this
  process, plus add, flush, clear, checkpoint and replacing the contents; its writer
  saves the stream's and the sampler's state (priorities included) with every commit
  (:class:`~zreplay.core.saved.SavedState`) and resumes them when reopened.
* :class:`~zreplay.core.view.ViewCore` (:meth:`BufferCore.reader`), over a
  :class:`~zreplay.engine.reader.BufferReader`: the union of every segment, as
  ``zreplay.open`` gives, plus what segments a view shows.

Positions (what a sampler draws, what :meth:`BufferCore.rows` takes, what a hook
returns) are ``[0, num_rows)`` over the visible rows, oldest first, in both kinds (see
:mod:`zreplay.index.coords`): a sampler, a hook or an index written for a view reads the
same rows from a writer.  Global rows (stable under eviction) stay inside: storage, the
RAM tier, prioritized trees, a prioritized batch's ``index``; a writer reads by them only
through :meth:`WritableCore.read_global_rows <zreplay.core.writable.WritableCore.read_global_rows>`.

Everything a facade needs is a public method here or on the two kinds; see
CONTRIBUTING.md ("A facade").
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.prepared import Prepared
from ..engine.protocol import Engine
from ..errors import EmptyBufferError
from ..index.episodes import EpisodeView
from ..samplers import Sampler, as_sampler
from ..samplers.contract import Context
from ..sampling import plans
from ..sampling.clips import ClipSpec
from ..sampling.nstep import NStepSpec
from .bound_sampler import BoundSampler
from .rate import RateGate, RateLimiter, check_rate_options
from .records import BATCH_BYTES, TrajectoryRecord, read_episodes, read_rows, read_trajectories
from .stream import RandomStream

__all__ = ["BufferCore", "Handoff", "Prepared", "TrajectoryRecord"]

log = logging.getLogger("zreplay")
_NO_GATE = contextlib.nullcontext()


class BufferCore:
    """A buffer's engine, sampler and random stream: the read side every kind shares
    (see the module docstring).

    Construct with :meth:`writer` or :meth:`reader`.  ``owner`` is the facade object a
    sampler hook ``fn(step, buffer, batch_size, history_len)`` receives as ``buffer``.
    """

    writable = False
    # The kinds :meth:`writer` and :meth:`reader` make, filled in as they are defined
    # (they import this module, so it cannot import them).
    _kinds: dict[str, type[BufferCore]] = {}

    def __init_subclass__(cls, kind: str | None = None, **kw):
        super().__init_subclass__(**kw)
        if kind is not None:
            BufferCore._kinds[kind] = cls

    def __init__(self, engine: Engine, sampler: Sampler, stream: RandomStream, owner: Any = None):
        self.engine = engine
        self.stream = stream
        # The facade, held weakly (it holds the core): a hook's ``buffer`` argument.
        self._owner_ref = weakref.ref(owner) if owner is not None else (lambda: self)
        self._bound = BoundSampler(as_sampler(sampler), self, self._owner)
        self.rate: RateGate | None = None
        # Set by close(): a wait on this core's behalf (a rate limit, a dataset waiting for
        # rows) ends at once (zreplay.core.waits).
        self.closing = threading.Event()
        if owner is not None:
            # Once the facade is collected, this core closes: what was added is committed
            # and the writer lock released, for every facade alike (a notebook cell run
            # again after ``del buf`` reopens the path); a learner says it stopped.
            weakref.finalize(owner, _close_dropped, self)

    @property
    def _owner(self) -> Any:
        return self._owner_ref()

    def __repr__(self) -> str:
        return f"<zreplay buffer {self.path} (read-only)>"

    @classmethod
    def writer(cls, path, **options) -> BufferCore:
        """A :class:`~zreplay.core.writable.WritableCore` on the buffer at ``path`` (see
        its ``open``)."""
        return BufferCore._kinds["writer"].open(path, **options)

    @classmethod
    def reader(cls, path, **options) -> BufferCore:
        """A :class:`~zreplay.core.view.ViewCore` over every segment of the buffer at
        ``path`` (see its ``open``)."""
        return BufferCore._kinds["reader"].open(path, **options)

    @property
    def path(self):
        return self.engine.path

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
        everything added first, so the other side sees it; a private temporary store is
        refused (:class:`~zreplay.errors.HandoffError`, naming ``path_arg``) unless
        ``allow_temporary`` (DataLoader workers, which die with this process).
        ``sampler=False``: the other side does not sample (no copy of the sampler is
        made; ``Handoff.sampler`` is None)."""
        copy = self.sampler.unbound_copy() if sampler else None
        return Handoff(str(self.path), self.path.backend.storage_options, copy)

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
    def num_trajectories(self) -> int:
        return self.engine.num_trajectories

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
        """What a core does first in a process it was not made in (a view: reopen)."""

    def read(
        self, draw: Callable[[Any], object], alloc=None, redraw: bool = True
    ) -> tuple[object, dict]:
        """``draw(snapshot)`` at one consistent instant, then gather what it asks for (see
        :meth:`Engine.read <zreplay.engine.protocol.Engine.read>`); returns ``(what draw
        returned, {name: array})``.  ``redraw=False``: ``draw`` reads positions the
        caller chose, which a reader never re-resolves on a refreshed snapshot
        (``StaleViewError`` if its rows went)."""
        self._check_process()
        return self.engine.read(draw, alloc, redraw)

    def _read_at(self, draw, alloc=None) -> tuple[object, dict]:
        # Positions the caller chose (an index, an episode, a trajectory) mean rows of
        # the snapshot it counted them in: never drawn again on another one.
        return self.read(draw, alloc, redraw=False)

    def pick(self, n: int, step: int | None = None, version: float | None = None):
        """The sampler's ``pick(units, snapshot)`` for ``n`` units (the stream's step is
        taken now unless ``step`` is given); ``version``: the caller's policy version."""
        step = self.stream.take_step(step)
        return self._bound.pick(self.stream.rng, n, step, version)

    def _gate(self, n: int) -> contextlib.AbstractContextManager:
        """The rate gate a sample of ``n`` units passes once (none without a limiter)."""
        return _NO_GATE if self.rate is None else self.rate.sampling(n)

    def sample(
        self, n: int, keys: list[str] | None = None, alloc=None, version: float | None = None
    ) -> dict[str, np.ndarray]:
        """``n`` rows drawn by the sampler (flat dict; ``index``/``weight`` beside the data
        for a prioritized sampler), or ``n`` clips for a sampler with a clip shape.
        ``alloc(name, shape, dtype)`` provides each data output (rows only); ``version``:
        the policy version now trained (``Staleness`` weighs rows by it).  ``n`` (an int
        >= 1) and ``version`` (a float or None) come checked by the facade the user
        called, in its own words; a rate-limited sample passes the gate once."""
        self._check_process()
        sampler = self._bound.sampler
        if sampler.clips is not None:
            return self.sample_clips(sampler.clips, n, keys, version=version)
        stream, owner = self.stream, self._owner_ref()
        took: list = []  # [step, extra] of the draw: a view's retry draws again, same step

        def draw(snap):
            if snap.num_rows <= 0:
                raise EmptyBufferError(self.engine.empty_message())
            if not took:
                took.append(stream.take_step())
            ctx = Context(stream.rng, snap.space, took[0], owner, version)
            rows, extra = sampler.draw_rows(ctx, n)
            took[1:] = [extra]
            return rows if keys is None else {k: (k, rows) for k in keys}

        with self._gate(n):
            _, out = self.engine.read(draw, alloc)  # a retried read draws again: counted once
            stream.num_sampled += n
        return plans.add_extra(out, took[1]) if took[1] else out

    def sample_clips(
        self, spec: ClipSpec, n: int, keys: list[str] | None = None, step=None, version=None
    ) -> dict[str, np.ndarray]:
        """``n`` clips ``{key: [n, history_len, ...]}`` drawn by the sampler over every
        valid clip (``is_pad`` with padding; ``index``/``weight`` when prioritized);
        ``n``, ``step`` and ``version`` as the facade checked them."""
        self._check_process()
        with self._gate(n):
            fn, finish = plans.clip_read(spec, keys or self.keys, self.pick(n, step, version))
            # A random draw (the process was checked above): drawn again on a refreshed
            # snapshot if its rows went.
            return finish(self.engine.read(fn)[1])

    def clips(self, spec: ClipSpec, indices, keys: list[str] | None = None) -> dict:
        """Clips at flat clip indices ``[0, spec.num_clips(episodes))``."""
        return plans.gather_clips(self._read_at, spec, keys or self.keys, plans.fixed(indices))

    def sample_nstep(
        self, spec: NStepSpec, n: int, keys: list[str] | None = None, step=None, version=None
    ) -> dict[str, np.ndarray]:
        """``n`` n-step transitions (see :func:`zreplay.sampling.plans.gather_nstep`);
        ``n``, ``step`` and ``version`` as the facade checked them."""
        self._check_process()
        with self._gate(n):
            pick = self.pick(n, step, version)
            return plans.gather_nstep(self.engine.read, spec, self.keys, pick, keys)

    def episode(self, e: int, keys=None, start: int = 0, stop=None) -> dict[str, np.ndarray]:
        """Visible steps ``[start, stop)`` (default all) of episode ``e`` as arrays (ints,
        as the facade checked them)."""
        return plans.gather_episode(self._read_at, keys or self.keys, e, start, stop)

    def rows(self, positions, keys: list[str] | None = None) -> dict[str, np.ndarray]:
        """Rows at visible positions ``[0, num_rows)``, oldest first (a writer's as a
        view's: see :func:`~zreplay.core.records.read_rows`)."""
        return read_rows(self._read_at, self.keys if keys is None else list(keys), positions)

    def trajectory(self, i: int, keys: list[str] | None = None) -> TrajectoryRecord:
        """Visible trajectory ``i`` (an int the facade checked: 0 = oldest kept; negative
        from the newest)."""
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
        """Pick up what writers committed since (True if anything new became visible);
        a writable core reads its live state: always False."""
        self._check_process()
        return self.engine.refresh()

    def stale(self) -> bool:
        """Has a writer committed since the last refresh (cheap: a ``stat`` per segment)?
        A writable core reads its live state: never."""
        self._check_process()
        return self.engine.stale()

    def flush(self) -> None:
        """Block until everything added is committed (a view has nothing pending)."""

    def _closing_soon(self) -> None:
        """It is about to be closed on another thread (its facade was dropped): whoever
        waits for what it holds (a learner's name) waits for that."""
        if self.rate is not None:
            self.rate.closing_soon()

    def close(self) -> None:
        """Close the engine (a writer: commit, unlock); a rate-limited learner publishes
        that it stopped; waits on this core's behalf in other threads end."""
        self.closing.set()
        if self.rate is not None:
            self.rate.close()
        self.engine.close()

    def full_state(self) -> dict:
        """The stream and sampler state, priorities as arrays (for ``torch.save``)."""
        out = self.stream.state()
        out.update(self.engine.locked(lambda snap: self._bound.full_state(snap.space)))
        return out

    def load_full_state(self, state: Mapping) -> None:
        self.stream.load(state)
        self.engine.locked(lambda snap: self._bound.load_full_state(state, lambda: snap.space))


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
    core._closing_soon()
    threading.Thread(target=_close_quietly, args=(core,), name="zreplay-close").start()


def _close_quietly(core: BufferCore) -> None:
    try:
        core.close()
    except Exception as e:  # noqa: BLE001 - nobody is left to raise it to
        log.error("zreplay: closing %s after it was dropped failed: %r", core.path, e)
