"""The one reader: requests -> RAM tier and/or segments -> unique rows -> batched reads ->
scatter into caller-provided outputs.  Writable buffers and read-only views both read
through :func:`gather_begin` / :func:`gather_finish`.

A read sees a :class:`Snapshot`: the visible rows of one or more segments laid out as
*positions* (part ``i`` holds positions ``[bounds[i], bounds[i + 1])``), taken at one
consistent instant.  A *request* ``{name: (key, positions)}`` asks for output ``name`` of
shape ``positions.shape + row_shape`` gathered from stored ``key``; requests whose
positions are the same array (by identity) are located and read once for all their keys.

Rows a writer's RAM tier holds are one numpy fancy index per key; the rest are read from
disk with one batched read per key and part over the sorted unique rows (a plain range
read when they are contiguous), all in flight before the first is waited on, then
scattered back with the inverse indices.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import CorruptBufferError
from ..index.episodes import EpisodeView
from ..index.rowspace import RowSpace
from ..index.trajectories import TrajectoryIndex
from ..schema import Schema
from ..store.segment import Segment
from .ramtier import RamTier

Requests = Mapping[str, tuple[str, np.ndarray]]
Alloc = Callable[[str, tuple, np.dtype], np.ndarray]


def _empty(_name: str, shape: tuple, dtype: np.dtype) -> np.ndarray:
    return np.empty(shape, dtype)


class Evicted(Exception):
    """Rows drawn from a snapshot were evicted and their shards deleted while they were
    read (a view reading another process's segment): draw again from a fresh snapshot."""


class Part:
    """One segment's visible trajectories (``index.low`` on) and global rows
    ``[low_row, n_rows)`` (``index``'s, passed in), at positions ``[pos0, pos0 + n_rows -
    low_row)``.

    ``tier``: the writer's RAM tier (rows at or above ``tier_lo`` are read from RAM);
    ``reclaimed(row)``: for segments another process writes, whether that writer has
    since published a commit under which ``row`` is gone (evicted and reclaimed, the
    segment cleared or replaced): then a failed or fill-value read means the rows went,
    not that they are damaged."""

    __slots__ = ("segment", "index", "pos0", "tier", "tier_lo", "reclaimed", "low_row", "n_rows")

    def __init__(
        self,
        segment: Segment,
        index: TrajectoryIndex,
        low_row: int,
        n_rows: int,
        pos0: int,
        tier: RamTier | None = None,
        tier_lo: int = 0,
        reclaimed: Callable[[int], bool] | None = None,
    ):
        self.segment, self.index, self.low_row, self.n_rows = segment, index, low_row, n_rows
        self.pos0, self.tier, self.tier_lo, self.reclaimed = pos0, tier, tier_lo, reclaimed

    def rows(self, positions: np.ndarray) -> np.ndarray:
        if self.pos0 == self.low_row:
            return positions
        return positions + (self.low_row - self.pos0)


class Snapshot:
    """What one read sees: consistent at one instant (taken under the writer's lock, or
    from one refresh of a view).  ``episodes``, ``space`` and ``bounds`` (part ``i`` holds
    positions ``[bounds[i], bounds[i + 1])``) are computed on first use (a plain class:
    ``functools.cached_property`` takes a lock per first access on Python 3.11, a
    measurable cost on the sampling path)."""

    __slots__ = ("schema", "parts", "_make_episodes", "_make_space", "_bounds", "_episodes")
    __slots__ += ("_space", "_traj")

    def __init__(
        self,
        schema: Schema | None,
        parts: list[Part],
        make_episodes: Callable[[], EpisodeView],
        make_space: Callable[[], RowSpace],
        bounds: np.ndarray | None = None,
    ):
        self.schema, self.parts = schema, parts
        self._make_episodes, self._make_space = make_episodes, make_space
        self._bounds = bounds
        self._episodes = self._space = self._traj = None

    @property
    def bounds(self) -> np.ndarray:
        if self._bounds is None:
            sizes = [p.n_rows - p.low_row for p in self.parts]
            pos0 = self.parts[0].pos0 if self.parts else 0
            self._bounds = pos0 + np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        return self._bounds

    @property
    def episodes(self) -> EpisodeView:
        if self._episodes is None:
            self._episodes = self._make_episodes()
        return self._episodes

    @property
    def space(self) -> RowSpace:
        if self._space is None:
            self._space = self._make_space()
        return self._space

    @property
    def num_rows(self) -> int:
        if len(self.parts) == 1:
            p = self.parts[0]
            return p.n_rows - p.low_row
        return sum(p.n_rows - p.low_row for p in self.parts)

    @property
    def keys(self) -> list[str]:
        return [] if self.schema is None else self.schema.keys

    @property
    def _traj_bounds(self) -> np.ndarray:
        if self._traj is None:
            counts = [p.index.num_visible for p in self.parts]
            self._traj = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        return self._traj

    @property
    def num_trajectories(self) -> int:
        return int(self._traj_bounds[-1])

    def trajectory(self, i: int) -> TrajectoryRef:
        """Visible trajectory ``i`` (``-n <= i < n``, oldest segment first)."""
        n = self.num_trajectories
        if not -n <= i < n:
            raise IndexError(f"trajectory {i} out of range for {n} trajectories")
        i %= n
        si = int(np.searchsorted(self._traj_bounds, i, side="right") - 1)
        part = self.parts[si]
        j = part.index.low + (i - int(self._traj_bounds[si]))
        pos = part.pos0 + int(part.index.offsets[j]) - part.low_row
        return TrajectoryRef(part, j, pos)


@dataclass
class TrajectoryRef:
    """Trajectory ``j`` of ``part``'s index, at positions ``[pos, pos + T * B)``."""

    part: Part
    j: int
    pos: int

    def metadata(self) -> dict:
        """``trajectory_id``, ``max_episode_length``, ``model_weights_id``, ``T``, ``B``."""
        return self.part.index.metadata(self.j)

    def positions(self) -> np.ndarray:
        off = self.part.index.offsets
        return np.arange(self.pos, self.pos + int(off[self.j + 1] - off[self.j]), dtype=np.int64)


def group_requests(requests: Requests) -> list[tuple[np.ndarray, list[tuple[str, str]]]]:
    """Requests that share one positions array (by identity): ``[(positions, [(name,
    key), ...])]``, so those positions are located and read once for all their keys."""
    groups: dict[int, tuple] = {}
    for name, (key, rows) in requests.items():
        groups.setdefault(id(rows), (rows, []))[1].append((name, key))
    return list(groups.values())


@dataclass
class _DiskRead:
    part: Part
    sel: np.ndarray | None  # output rows this read fills (None: all of them)
    rows: np.ndarray  # their global rows
    members: list[tuple[str, str]]


@dataclass
class PendingGather:
    """Phase 2 of a gather: the disk reads left once RAM-tier rows are in place."""

    out: dict[str, np.ndarray]
    dst: dict[str, np.ndarray]  # each output viewed as [rows, *row_shape]
    reads: list[_DiskRead]


def gather_begin(snap: Snapshot, requests: Requests, alloc: Alloc | None = None) -> PendingGather:
    """Allocate every output (``alloc(name, shape, dtype)``, default ``np.empty``), fill
    what the RAM tier holds and list the disk reads.  A writer calls this under its lock
    (a concurrent add may reuse tier slots right after)."""
    alloc = alloc or _empty
    out, dst = {}, {}
    for name, (key, r) in requests.items():
        spec = snap.schema.specs[key]
        out[name] = alloc(name, (*r.shape, *spec.row_shape), spec.dtype)
        dst[name] = out[name].reshape(r.size, *spec.row_shape)
    reads: list[_DiskRead] = []
    parts = snap.parts
    for r, members in group_requests(requests):
        flat = np.asarray(r, np.int64).reshape(-1)
        if len(parts) == 1:
            _part_begin(parts[0], None, parts[0].rows(flat), members, dst, reads)
            continue
        which = np.searchsorted(snap.bounds, flat, side="right") - 1
        for i in np.unique(which):
            sel = np.flatnonzero(which == i)
            part = parts[int(i)]
            _part_begin(part, sel, part.rows(flat[sel]), members, dst, reads)
    return PendingGather(out, dst, reads)


def _part_begin(part: Part, sel, rows, members, dst, reads) -> None:
    tier = part.tier
    if tier is None:
        reads.append(_DiskRead(part, sel, rows, members))
        return
    in_tier = rows >= part.tier_lo
    if in_tier.all():
        slots = tier.slots(rows)
        for name, key in members:
            if sel is None:
                tier.gather(key, slots, out=dst[name])
            else:
                dst[name][sel] = tier.gather(key, slots)
        return
    if in_tier.any():
        hit = np.flatnonzero(in_tier)
        slots = tier.slots(rows[hit])
        at = hit if sel is None else sel[hit]
        for name, key in members:
            dst[name][at] = tier.gather(key, slots)
        miss = np.flatnonzero(~in_tier)
        sel, rows = (miss if sel is None else sel[miss]), rows[miss]
    reads.append(_DiskRead(part, sel, rows, members))


def gather_finish(pending: PendingGather) -> dict[str, np.ndarray]:
    """Run the disk reads (all in flight before the first is waited on) and scatter them
    into the outputs; returns the outputs.  ``Evicted`` where a view's rows were evicted
    under it; ``CorruptBufferError`` for damage."""
    started = []
    for rd in pending.reads:
        uniq, inv = np.unique(rd.rows, return_inverse=True)
        first, stop = int(uniq[0]), int(uniq[-1]) + 1
        seg = rd.part.segment
        keys = {key for _, key in rd.members}
        if stop - first == len(uniq):  # contiguous rows (a trajectory, clip runs): one range
            futs = {key: seg.read_range(key, first, stop) for key in keys}
        else:
            futs = {key: seg.read_rows(key, uniq) for key in keys}
        started.append((rd, inv, first, futs))
    dst = pending.dst
    for rd, inv, first, futs in started:
        try:
            for name, key in rd.members:
                got = futs[key].result()
                if rd.sel is None and len(inv) == len(dst[name]):
                    np.take(got, inv, axis=0, out=dst[name], mode="clip")
                else:
                    dst[name][rd.sel] = got[inv]
        except CorruptBufferError:
            # A writer deletes rows' files only after a commit that says they are gone.
            if rd.part.reclaimed is not None and rd.part.reclaimed(first):
                raise Evicted() from None
            raise
        # Where a deleted chunk fails to read (above), a read that succeeded is sound;
        # where it reads as fill values, only the commit can tell.
        part = rd.part
        if part.reclaimed is not None and part.segment.fills_missing and part.reclaimed(first):
            raise Evicted()
    return pending.out


def gather(snap: Snapshot, requests: Requests, alloc: Alloc | None = None) -> dict:
    """Both phases at once (for readers that hold no lock)."""
    return gather_finish(gather_begin(snap, requests, alloc))
