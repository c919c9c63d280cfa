"""What a sampler is and what it draws over.

A sampler chooses which *units* a batch reads; the buffer then gathers them.  Units are
either rows (one transition each: ``TrajectoryReplayBuffer.sample``, ``BufferView.sample``)
or units laid over the episode table (clips, n-step transitions: ``ReplayBuffer.sample``,
``sample_clips``, ``sample_nstep``).  Every sampler answers both kinds:

* ``draw_rows(ctx, n)`` -> ``(rows int64[n], extra)``: row positions in ``ctx.space``;
* ``draw_units(ctx, units, n)`` -> ``(flat int64[n], extra)``: flat unit indices in
  ``[0, units.total)``, oldest episode first.

``extra`` is what the batch carries beside its data keys: prioritized samplers return
``index`` (int64[n], what ``update_priorities`` takes) and ``weight`` (float32[n]).  A
buffer calls its sampler under its lock (writable buffers) or on one refreshed snapshot
(views), so the space and units a sampler sees are those the gather then reads.

Row positions are ``[0, num_rows)``, oldest visible row first, in a writable buffer
exactly as in a view (a view lays its segments one after another in name order), so a
sampler or hook draws the same rows from either.  Each segment's visible trajectories are
contiguous there, oldest first.  Its global rows (what a prioritized tree and a batch's
``index`` hold: stable under eviction) convert through :class:`VisibleRows` (the
coordinates: :mod:`zreplay.index.coords`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import EmptyBufferError
from ..index.coords import GlobalRow, Positions, TaggedRows, UnitIndices
from ..index.episodes import EpisodeView
from ..index.rowspace import RowSpace, SegmentRows, VisibleRows

Extra = dict[str, np.ndarray]
# What a draw returns: row positions (draw_rows) or unit indices (draw_units), int64[n].
Drawn = tuple[Positions | UnitIndices, Extra]

__all__ = [
    "Context",
    "Drawn",
    "Extra",
    "PrioritySampler",
    "RowSpace",
    "Sampler",
    "SegmentRows",
    "Units",
    "VisibleRows",
]


@dataclass
class Units:
    """Units laid over episodes: episode ``e`` has ``counts[e]`` of them (``cum`` is the
    inclusive cumsum), and its unit ``k`` starts at step ``k - offset`` (a padded clip
    may start before step 0: ``offset`` = its ``pad_left``).

    A unit is *keyed* by the row of step ``max(k - offset, 0)``: that row's priority is
    the unit's.  Every row of an episode up to step ``counts - offset - 1`` keys exactly
    one unit, except step 0, which keys all units that start at or before it.
    """

    view: EpisodeView
    counts: np.ndarray
    cum: np.ndarray
    offset: int = 0
    history_len: int = 1
    name: str = "clip"

    @property
    def total(self) -> int:
        return int(self.cum[-1]) if len(self.cum) else 0

    def _keys_per_episode(self) -> np.ndarray:
        return np.where(self.counts > 0, np.maximum(self.counts - self.offset, 1), 0)

    def last_rows(self) -> Positions:
        """The newest row of each episode, int64[E]."""
        v = self.view
        return v.rows(np.arange(len(v)), v.length - 1)

    def from_rows(self, rows: Positions, rng: np.random.Generator) -> UnitIndices:
        """Flat index of the unit each row keys (int64, -1 where it keys none); a row that
        keys several units (step 0 under padding) picks one of them uniformly."""
        ep, step = self.view.locate_rows(rows)
        e = np.maximum(ep, 0)
        keys = self._keys_per_episode()
        ok = (ep >= 0) & (step < keys[e]) if len(keys) else np.zeros(len(ep), bool)
        k = step + self.offset
        if self.offset:
            first = ok & (step == 0)
            if first.any():
                top = np.minimum(self.offset, self.counts[e[first]] - 1)
                k[first] = (rng.random(int(first.sum())) * (top + 1)).astype(np.int64)
        base = np.where(e > 0, self.cum[np.maximum(e - 1, 0)], 0) if len(keys) else 0
        return np.where(ok, base + k, -1)

    def key_rows(self) -> Positions:
        """Every row that keys a unit, int64[K] (O(K): the exact path when rejection
        sampling keeps missing)."""
        keys = self._keys_per_episode()
        total = int(keys.sum())
        ep = np.repeat(np.arange(len(keys)), keys)
        starts = np.concatenate([[0], np.cumsum(keys)[:-1]]) if len(keys) else keys
        step = np.arange(total) - np.repeat(starts, keys)
        return self.view.rows(ep, step)


@dataclass
class Context:
    """What a draw may look at: the buffer's generator, its rows, its step counter (the
    number of batches drawn before, or the step the caller passed), the buffer itself
    (for ``fn(step, buffer, batch_size, history_len)`` hooks) and the policy version the
    caller passed (``sample(n, version=v)``; samplers that do not weigh by version ignore
    it)."""

    rng: np.random.Generator
    space: RowSpace
    step: int = 0
    buffer: Any = None
    version: float | None = None


class Sampler:
    """Base class of the built-in samplers; see the module docstring for the contract.

    Samplers whose batches carry ``index``/``weight`` and that accept
    :meth:`update_priorities` subclass :class:`PrioritySampler` (``prioritized = True``);
    ``clips`` (a ClipSpec) is set when row entry points should return clips, not rows.
    """

    prioritized = False
    clips = None
    _owner: weakref.ref | None = None  # the buffer or view a prioritized sampler serves

    def draw_rows(self, ctx: Context, n: int) -> Drawn:
        raise NotImplementedError

    def draw_units(self, ctx: Context, units: Units, n: int) -> Drawn:
        raise NotImplementedError

    def update_priorities(self, space: RowSpace, index: TaggedRows, priorities) -> int:
        raise TypeError(
            f"{type(self).__name__} has no priorities; construct the buffer with "
            "sampler=zreplay.samplers.Prioritized() to use update_priorities"
        )

    def priorities(self, space: RowSpace, index: TaggedRows) -> np.ndarray:
        raise TypeError(
            f"{type(self).__name__} has no priorities; construct the buffer with "
            "sampler=zreplay.samplers.Prioritized() to read them"
        )

    def claim(self, owner: object) -> None:
        """Bind a stateful (prioritized) sampler to one buffer or view: its priorities
        are those of one set of rows, so a second owner is refused while the first
        lives.  Stateless samplers serve any number of buffers."""
        if not self.prioritized:
            return
        self.check_unclaimed(owner)
        self._owner = weakref.ref(owner)

    def check_unclaimed(self, owner: object = None) -> None:
        """``ValueError`` if a prioritized sampler serves a live buffer or view other than
        ``owner`` (buffers check before they make anything)."""
        current = self._owner() if self._owner is not None else None
        if current is not None and current is not owner and not getattr(current, "closed", False):
            raise ValueError(
                f"this {type(self).__name__} already samples {current!r}; give each buffer "
                "or view its own sampler instance"
            )

    def drops(self, item) -> bool:
        """Whether a full buffer drops ``item`` (a trajectory about to be added, with
        ``columns`` and ``model_weights_id``) instead of evicting its oldest rows for it.
        Built-ins keep everything except ``Staleness(evict_stale=True)``.  Decides only:
        :meth:`admitted` hears what the add then did."""
        return False

    def admitted(self, item, kept: bool) -> None:
        """An add went through with ``item`` in its batch: added (``kept``) or dropped
        (``drops`` said so).  Nothing by default."""

    def config(self) -> dict:
        """Constructor arguments (JSON values)."""
        return {}

    def state_dict(self) -> dict:
        """JSON state saved with every commit: ``{"kind": class name, **config}``."""
        return {"kind": type(self).__name__, **self.config()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` saved (stateless samplers: nothing)."""

    def unbound_copy(self) -> Sampler:
        """A new sampler of the same configuration and saved state, bound to no buffer
        (what a buffer or view handed to another process samples with there)."""
        new = type(self)(**self.config())
        new.load_state_dict(self.state_dict())
        return new

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({args})"


class PrioritySampler(Sampler):
    """A sampler with priorities (``prioritized = True``): batches carry ``index`` and
    ``weight``, :meth:`update_priorities` changes what is drawn next, and writable buffers
    save the priorities with their commits.  What a buffer calls beyond :class:`Sampler`:

    * ``sync(space)`` before any use: follow the rows ``space`` holds now (new rows get
      the initial priority, evicted rows leave);
    * ``priorities(space, index)`` / ``update_priorities(space, index, values)``;
    * ``snapshot(key, stop_row)`` -> ``(meta, leaves)`` or None: what a commit of segment
      ``key`` up to ``stop_row`` saves (marks it saved); ``mark_changed(key)`` when that
      commit was not published after all; at most every ``save_every_s`` seconds in the
      background (always on ``flush``/``close``);
    * ``priorities_state()`` / ``load_priorities_state(state, space)``: every segment's
      priorities for ``state_dict``/``torch.save`` and back.
    """

    prioritized = True
    save_every_s: float = 10.0

    def sync(self, space: RowSpace) -> None:
        raise NotImplementedError

    def priorities(self, space: RowSpace, index: TaggedRows) -> np.ndarray:
        raise NotImplementedError

    def update_priorities(self, space: RowSpace, index: TaggedRows, priorities) -> int:
        raise NotImplementedError

    def snapshot(self, key: int, stop_row: GlobalRow) -> tuple[dict, np.ndarray] | None:
        raise NotImplementedError

    def mark_changed(self, key: int) -> None:
        raise NotImplementedError

    def priorities_state(self) -> dict:
        raise NotImplementedError

    def load_priorities_state(self, state: dict, space: RowSpace) -> None:
        raise NotImplementedError


def require_rows(space: RowSpace) -> None:
    if space.num_rows <= 0:
        raise EmptyBufferError("Cannot sample from an empty buffer.")


def draw_weighted(rng: np.random.Generator, mass: np.ndarray, n: int) -> np.ndarray:
    """``n`` group indices drawn with probability ``mass / mass.sum()`` (one cumsum and
    one searchsorted; a zero-mass group is never returned)."""
    cum = np.cumsum(mass, dtype=np.float64)
    total = cum[-1] if len(cum) else 0.0
    if not total > 0.0:
        raise EmptyBufferError("nothing to sample: every unit has weight 0")
    g = np.searchsorted(cum, rng.random(n) * total, side="right")
    # u * total may round up to total: such draws go to the last group with mass.
    return np.minimum(g, int(np.flatnonzero(mass > 0)[-1]))


def uniform_within(rng: np.random.Generator, sizes: np.ndarray) -> np.ndarray:
    """One uniform integer in ``[0, sizes[i])`` per entry (sizes >= 1)."""
    return np.minimum((rng.random(len(sizes)) * sizes).astype(np.int64), sizes - 1)


def draw_episode_weighted(
    rng: np.random.Generator, units: Units, weight: np.ndarray, n: int
) -> np.ndarray:
    """Flat unit indices: episode ``e`` with probability ``counts[e] * weight[e]``, then
    one of its units uniformly (so each unit's probability is proportional to its
    episode's weight)."""
    e = draw_weighted(rng, units.counts * weight, n)
    k = uniform_within(rng, units.counts[e])
    return np.where(e > 0, units.cum[np.maximum(e - 1, 0)], 0) + k


def episode_ages(space: RowSpace, units: Units) -> np.ndarray:
    """Age (in its writer's trajectories) of the trajectory holding each episode's
    newest row, int64[E]; cached with the episode view."""
    traj = units.view.cached(
        ("trajectory_of_last_row",), lambda: space.trajectory_of(units.last_rows())
    )
    return space.age(traj)
