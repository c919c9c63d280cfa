"""The one reader: requests -> RAM tier, column cache and/or segments -> batched reads ->
outputs.  Writable buffers and read-only views both read through :func:`gather_begin` /
:func:`gather_finish`.

A read sees a :class:`Snapshot`: the visible rows of one or more segments laid out as
*positions* (part ``i`` holds positions ``[bounds[i], bounds[i + 1])``), taken at one
consistent instant.  A *request* ``{name: (key, positions)}`` asks for output ``name`` of
shape ``positions.shape + row_shape`` gathered from stored ``key``; requests whose
positions are the same array (by identity) are located and read once for all their keys.

Rows a writer's RAM tier holds are one numpy fancy index per key, and so are rows of
small keys a segment's :class:`~zreplay.engine.colcache.ColumnCache` holds; the rest are
read from disk with one batched read per key and part, all in flight before the first is
waited on: a plain range read when the rows are contiguous (a trajectory, an episode),
otherwise one read of the positions as drawn (repeats and any order allowed, so nothing
is sorted or scattered afterwards).  Where the caller gave no ``alloc`` and one read
fills a whole output, the array the read returned *is* the output (no copy).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import CorruptBufferError
from ..index.coords import GlobalRow, GlobalRows, Position, Positions, positions_of, rows_at
from ..index.episodes import EpisodeView
from ..index.rowspace import RowSpace
from ..index.trajectories import TrajectoryIndex
from ..schema import Schema
from ..store.segment import Segment
from .colcache import ColumnCache, StaleRead
from .ramtier import RamTier

Requests = Mapping[str, tuple[str, Positions]]
# Contiguous reads at least this long (whole trajectories, episodes: exports, copies)
# bypass the column cache: they read each row once, so filling it would only add work.
BULK_ROWS = 4096
Alloc = Callable[[str, tuple, np.dtype], np.ndarray]


def _empty(_name: str, shape: tuple, dtype: np.dtype) -> np.ndarray:
    return np.empty(shape, dtype)


class Evicted(Exception):
    """Rows drawn from a snapshot were evicted and their shards deleted while they were
    read (a view reading another process's segment): draw again from a fresh snapshot."""


class Part:
    """One segment's visible trajectories (``index.low`` on) and global rows
    ``[low_row, n_rows)`` (``index``'s, passed in), at positions ``[first, first + n_rows -
    low_row)``.

    ``tier``: the writer's RAM tier (rows at or above ``tier_lo`` are read from RAM);
    ``cache``: the segment's column cache of small keys, which may hold committed rows
    below ``cache_hi`` (default ``n_rows``), and ``large_cache`` a second one of the
    large keys (images; a view's); ``reclaimed(row)``: for segments another
    process writes, whether that writer has since published a commit under which ``row``
    is gone (evicted and reclaimed, the segment cleared or replaced): then a failed or
    fill-value read means the rows went, not that they are damaged; ``live_from()``: the
    first row no such commit took away (None: none), for the column cache's fills."""

    __slots__ = ("segment", "index", "first", "tier", "tier_lo", "reclaimed", "low_row", "n_rows")
    __slots__ += ("cache", "caches", "cache_hi", "cache_id", "live_from")

    def __init__(
        self,
        *,
        segment: Segment,
        index: TrajectoryIndex,
        low_row: GlobalRow,
        n_rows: GlobalRow,
        first: Position,
        tier: RamTier | None = None,
        tier_lo: GlobalRow = 0,
        reclaimed: Callable[[GlobalRow], bool] | None = None,
        cache: ColumnCache | None = None,
        large_cache: ColumnCache | None = None,
        cache_hi: GlobalRow | None = None,
        cache_id: str | None = None,
        live_from: Callable[[], GlobalRow | None] | None = None,
    ):
        self.segment, self.index, self.low_row, self.n_rows = segment, index, low_row, n_rows
        self.first, self.tier, self.tier_lo, self.reclaimed = first, tier, tier_lo, reclaimed
        self.cache = cache if cache is not None and cache.keys else None
        large = large_cache if large_cache is not None and large_cache.keys else None
        # (filter, not a generator: a frame on every writer's snapshot)
        self.caches = tuple(filter(None, (self.cache, large)))
        self.cache_hi = n_rows if cache_hi is None else cache_hi
        self.cache_id, self.live_from = cache_id, live_from

    def rows_at(self, positions: Positions) -> GlobalRows:
        """Global rows at ``positions`` (all within this part)."""
        return rows_at(positions, self.low_row, self.first)

    def positions(self, rows: GlobalRows) -> Positions:
        """Positions of its global ``rows`` (int64, any shape); ``IndexError`` for a row
        it does not show (evicted, or not added yet)."""
        if rows.size and (int(rows.min()) < self.low_row or int(rows.max()) >= self.n_rows):
            raise IndexError(
                f"global rows must lie in the segment's visible rows [{self.low_row}, "
                f"{self.n_rows}) (older ones were evicted)"
            )
        return positions_of(rows, self.low_row, self.first)


class Snapshot:
    """What one read sees: consistent at one instant (taken under the writer's lock, or
    from one refresh of a view).  ``episodes``, ``space`` and ``bounds`` (part ``i`` holds
    positions ``[bounds[i], bounds[i + 1])``) are computed on first use (a writer's
    ``space`` comes built: it lasts until its index changes) (a plain class:
    ``functools.cached_property`` takes a lock per first access on Python 3.11, a
    measurable cost on the sampling path)."""

    __slots__ = ("schema", "parts", "_make_episodes", "_make_space", "_bounds", "_episodes")
    __slots__ += ("_space", "_traj")

    def __init__(
        self,
        schema: Schema | None,
        parts: list[Part],
        make_episodes: Callable[[], EpisodeView],
        make_space: Callable[[], RowSpace] | None,
        bounds: np.ndarray | None = None,
        space: RowSpace | None = None,
    ):
        self.schema, self.parts = schema, parts
        self._make_episodes, self._make_space = make_episodes, make_space
        self._bounds = bounds
        self._episodes = self._traj = None
        self._space = space  # (built beforehand where it is kept across snapshots)

    @property
    def bounds(self) -> np.ndarray:
        if self._bounds is None:
            sizes = [p.n_rows - p.low_row for p in self.parts]
            first = self.parts[0].first if self.parts else 0
            self._bounds = first + np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
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
        pos = positions_of(int(part.index.offsets[j]), part.low_row, part.first)
        return TrajectoryRef(part, j, pos)


@dataclass
class TrajectoryRef:
    """Trajectory ``j`` of ``part``'s index, at positions ``[pos, pos + T * B)``."""

    part: Part
    j: int
    pos: Position

    def metadata(self) -> dict:
        """``trajectory_id``, ``max_episode_length``, ``model_weights_id``, ``T``, ``B``."""
        return self.part.index.metadata(self.j)

    def positions(self) -> Positions:
        off = self.part.index.offsets
        return np.arange(self.pos, self.pos + int(off[self.j + 1] - off[self.j]), dtype=np.int64)


def as_requests(drawn, schema) -> Requests:
    """What a draw returned as requests: a dict of requests as it is, else row positions
    read for every key of ``schema``."""
    if isinstance(drawn, dict):
        return drawn
    rows = np.asarray(drawn, np.int64)
    return {k: (k, rows) for k in schema.keys}


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
    rows: GlobalRows  # theirs (any order, repeats allowed)
    members: list[tuple[str, str]]


class PendingGather:
    """Phase 2 of a gather: the disk reads left once RAM rows are in place.  Outputs are
    allocated on first use (``alloc``), except that one read filling a whole output
    becomes that output where ``adopt`` (no caller ``alloc``)."""

    __slots__ = ("out", "dst", "reads", "served", "_shapes", "_alloc", "adopt")

    def __init__(self, shapes: dict, alloc: Alloc | None):
        self.out: dict[str, np.ndarray] = {}
        self.dst: dict[str, np.ndarray] = {}  # each output viewed as [rows, *row_shape]
        self.reads: list[_DiskRead] = []
        # (part, first row) of rows a large keys' column cache gave in place of a disk
        # read: checked against the commit as those reads are (see gather_finish).
        self.served: list[tuple[Part, GlobalRow]] = []
        self._shapes, self._alloc, self.adopt = shapes, alloc or _empty, alloc is None

    def target(self, name: str) -> np.ndarray:
        """Output ``name`` as ``[rows, *row_shape]``, allocated now if it is not yet."""
        d = self.dst.get(name)
        if d is None:
            shape, dtype, row_shape = self._shapes[name]
            self.out[name] = self._alloc(name, shape, dtype)
            d = self.dst[name] = self.out[name].reshape(-1, *row_shape)
        return d

    def fill(self, name: str, source, key: str, slots: np.ndarray) -> None:
        """Every row of output ``name`` from ``source.gather(key, slots, out)`` (a RAM
        tier or a column cache: one fancy index), straight into the allocated output, or
        becoming the output where it may."""
        if self.adopt and name not in self.dst:
            got = source.gather(key, slots)
            self.dst[name] = got
            self.out[name] = got.reshape(self._shapes[name][0])
        else:
            source.gather(key, slots, self.target(name))

    def adopt_rows(self, name: str, got: np.ndarray) -> None:
        """``got`` (``[rows, *row_shape]``, every row of ``name``, in order, an array of
        its own) is the output (only where ``adopt``)."""
        self.dst[name] = got
        self.out[name] = got.reshape(self._shapes[name][0])

    def take(self, name: str, got: np.ndarray, taken: set) -> None:
        """Make ``got`` (every row of ``name``, in order) the output: adopted when
        allowed (each read result once), else copied into the allocated output."""
        if self.adopt and name not in self.dst and id(got) not in taken:
            shape = self._shapes[name][0]
            if got.flags.c_contiguous and got.size == int(np.prod(shape)):
                taken.add(id(got))
                self.out[name] = got.reshape(shape)
                self.dst[name] = got
                return
        np.copyto(self.target(name), got.reshape(self.target(name).shape))

    def finish_outputs(self) -> dict[str, np.ndarray]:
        for name in self._shapes:
            if name not in self.dst:  # an empty request reads nothing
                self.target(name)
        # In request order (map and zip: no comprehension frame on the sampling path).
        return dict(zip(self._shapes, map(self.out.__getitem__, self._shapes), strict=True))


def gather_begin(snap: Snapshot, requests: Requests, alloc: Alloc | None = None) -> PendingGather:
    """Fill what the RAM tier and the column caches hold (outputs come from
    ``alloc(name, shape, dtype)``, default ``np.empty``) and list the disk reads.  A
    writer calls this under its lock (a concurrent add may reuse tier slots right
    after)."""
    shapes = {}
    for name, (key, r) in requests.items():
        spec = snap.schema.specs[key]
        shapes[name] = ((*r.shape, *spec.row_shape), spec.dtype, spec.row_shape)
    pending = PendingGather(shapes, alloc)
    parts = snap.parts
    for r, members in group_requests(requests):
        flat = np.asarray(r, np.int64).reshape(-1)
        if not len(flat):
            continue
        if len(parts) == 1:
            part = parts[0]
            rows = rows_at(flat, part.low_row, part.first)
            # A sample's common case is read right here, one fancy index per key (each
            # call between a facade and the data costs ~1 us of a ~50 us sample): every
            # row in the RAM tier, or every key in a column cache holding every row.
            tier = part.tier
            if tier is not None and (part.tier_lo <= part.low_row or rows.min() >= part.tier_lo):
                slots = tier.slots(rows, part.n_rows)
                for name, key in members:
                    if pending.adopt:
                        pending.adopt_rows(name, tier.gather(key, slots))
                    else:
                        tier.gather(key, slots, pending.target(name))
                continue
            if tier is None and part.caches and pending.adopt and len(rows) < BULK_ROWS:
                # Keys whose column cache already holds every row (a clip's small keys
                # and its images: two caches), read right here too; the rest below.
                low = None
                for cache in part.caches:
                    mine, rest, held = [], [], cache.key_set
                    for m in members:  # (no call: a frame on every sample otherwise)
                        (mine if m[1] in held else rest).append(m)
                    if not mine:
                        continue
                    with cache.lock:
                        lo = cache.holding(part.low_row, part.cache_hi, part.cache_id, mine)
                        if lo is None:
                            continue
                        if lo > part.low_row:
                            low = int(rows.min()) if low is None else low
                            if low < lo:
                                continue
                        slots = cache.slots(rows, part.cache_hi)
                        for name, key in mine:
                            pending.adopt_rows(name, cache.gather(key, slots))
                        if cache is not part.cache:  # checked against the commit
                            low = int(rows.min()) if low is None else low
                            pending.served.append((part, low))
                        if not cache.kept(lo):  # another process reused their slots
                            pending.reads.append(_DiskRead(part, None, rows, mine))
                    members = rest
                if not members:
                    continue
            _part_begin(part, None, rows, members, pending)
            continue
        which = np.searchsorted(snap.bounds, flat, side="right") - 1
        for i in np.unique(which):
            sel = np.flatnonzero(which == i)
            part = parts[int(i)]
            _part_begin(part, sel, part.rows_at(flat[sel]), members, pending)
    return pending


def _fill(pending: PendingGather, members, sel, hit, source, slots: np.ndarray) -> None:
    """Outputs of ``members`` at ``sel[hit]`` (or ``hit``; None: every row) from RAM:
    ``source.gather(key, slots)`` (a RAM tier or a column cache)."""
    at = sel if hit is None else (hit if sel is None else sel[hit])
    for name, key in members:
        if at is None:
            pending.fill(name, source, key, slots)
        else:
            pending.target(name)[at] = source.gather(key, slots)


def _part_begin(part: Part, sel, rows: GlobalRows, members, pending: PendingGather) -> None:
    tier = part.tier
    if tier is not None:
        # When the tier holds every visible row, no row needs testing.
        in_tier = None if part.tier_lo <= part.low_row else rows >= part.tier_lo
        if in_tier is None or in_tier.all():
            slots = tier.slots(rows, part.n_rows)
            _fill(pending, members, sel, None, tier, slots)
            return
        if in_tier.any():
            hit = np.flatnonzero(in_tier)
            slots = tier.slots(rows[hit], part.n_rows)
            _fill(pending, members, sel, hit, tier, slots)
            miss = np.flatnonzero(~in_tier)
            sel, rows = (miss if sel is None else sel[miss]), rows[miss]
    bulk = bool(part.caches) and len(rows) >= BULK_ROWS and _contiguous(rows)
    ranged = None
    for cache in () if bulk else part.caches:
        if cache is not part.cache:
            # Large keys' rows are decoded into their cache by draws (samples, clips),
            # not by an episode or a trajectory read through (an export, a plot): that
            # would decode up to the whole budget of frames for a few rows.
            ranged = _contiguous(rows) if ranged is None else ranged
            if ranged:
                continue
        cached, members = _split(members, cache)
        if cached:
            with cache.lock:
                lo = _cover(part, cache)
                if lo <= part.low_row or int(rows.min()) >= lo:  # it holds every row
                    h, r = None, rows
                else:
                    hit = rows >= lo
                    h = np.flatnonzero(hit)
                    r = rows[h]
                    if len(h):  # the rows it does not hold are read from the store
                        miss = np.flatnonzero(~hit)
                        msel = miss if sel is None else sel[miss]
                        pending.reads.append(_DiskRead(part, msel, rows[miss], cached))
                if len(r):
                    s = cache.slots(r, part.cache_hi)
                    _fill(pending, cached, sel, h, cache, s)
                    if cache is not part.cache:
                        pending.served.append((part, int(r.min())))
                    if cache.lo > lo:  # another process reused their slots meanwhile
                        hsel = h if sel is None else (sel if h is None else sel[h])
                        pending.reads.append(_DiskRead(part, hsel, r, cached))
                    cached = []
            if cached:
                members = members + cached
    if members:
        pending.reads.append(_DiskRead(part, sel, rows, members))


def _split(members, cache: ColumnCache) -> tuple[list, list]:
    """``members`` as (those whose key ``cache`` holds, the others)."""
    held, other = [], []
    for m in members:
        (held if cache.holds(m[1]) else other).append(m)
    return held, other


def _cover(part: Part, cache: ColumnCache) -> int:
    """Bring ``cache`` up to the part's committed rows; returns the first row it holds.
    What was read is published only while the commit still shows what the snapshot
    showed (else it may be fill values of deleted shards, or another contents' rows at
    the same numbers: the writer loaded a checkpoint, or the buffer was made again)."""
    try:
        seg = part.segment
        return cache.cover(
            seg.read_range, part.low_row, part.cache_hi, part.cache_id, part.live_from,
            seg.forget_pages, seg.shard_stamps,
        )  # fmt: skip
    except StaleRead:
        raise Evicted() from None
    except CorruptBufferError:
        if part.reclaimed is not None and part.reclaimed(part.low_row):
            raise Evicted() from None
        raise


def _contiguous(rows: GlobalRows) -> bool:
    return int(rows[-1]) - int(rows[0]) + 1 == len(rows) and bool(np.all(np.diff(rows) == 1))


def gather_finish(pending: PendingGather) -> dict[str, np.ndarray]:
    """Run the disk reads (all in flight before the first is waited on) and put them
    into the outputs; returns the outputs.  ``Evicted`` where a view's rows were evicted
    under it; ``CorruptBufferError`` for damage."""
    started = []
    for rd in pending.reads:
        rows, seg = rd.rows, rd.part.segment
        keys = {key for _, key in rd.members}
        first = int(rows.min())
        if _contiguous(rows):  # a trajectory, an episode: one range
            futs = {key: seg.read_range(key, first, first + len(rows)) for key in keys}
        else:
            futs = {key: seg.read_points(key, rows) for key in keys}
        started.append((rd, first, futs))
    taken: set = set()
    for rd, first, futs in started:
        try:
            for name, key in rd.members:
                got = futs[key].result()
                if rd.sel is None:
                    pending.take(name, got, taken)
                else:
                    pending.target(name)[rd.sel] = got
        except CorruptBufferError:
            # A writer deletes rows' files only after a commit that says they are gone.
            if rd.part.reclaimed is not None and rd.part.reclaimed(first):
                raise Evicted() from None
            raise
    # A read that succeeded may still have read what the snapshot's rows are not: fill
    # values where shards were deleted, or rows of other contents at the same numbers (a
    # loaded checkpoint, a buffer made again with overwrite=True): only the commit can
    # tell, read once per segment read from, after its rows were read.  Rows of large
    # keys a column cache gave are checked the same way: a draw that met rows evicted
    # since its snapshot is drawn again on a fresh one, wherever they were read from.
    firsts: dict[int, tuple[Part, GlobalRow]] = {}
    for part, first in [*((rd.part, first) for rd, first, _ in started), *pending.served]:
        if part.reclaimed is not None:
            got = firsts.get(id(part))
            firsts[id(part)] = (part, first if got is None else min(got[1], first))
    for part, first in firsts.values():
        if part.reclaimed(first):
            raise Evicted()
    return pending.finish_outputs()


def gather(snap: Snapshot, requests: Requests, alloc: Alloc | None = None) -> dict:
    """Both phases at once (for readers that hold no lock)."""
    return gather_finish(gather_begin(snap, requests, alloc))
