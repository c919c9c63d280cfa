"""What a writer's segment holds at one instant, and the one place it changes.

:class:`WriterState` owns the commit record, the in-RAM index, the next trajectory and
episode ids, the lanes left open by the last trajectory and the RAM tier.  Every change
goes through one of its methods; its writer calls them with its lock held and does the
waiting and the I/O around them.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import CapacityError
from ..index.coords import RowRange
from ..index.rowspace import RowSpace, VisibleRows
from ..index.split import split_pieces
from ..schema import Schema
from ..store.commit import INT64_MAX, Commit, new_contents
from ..store.segment import Segment
from .colcache import ColumnCache, contents_ident
from .committer import Job, StateSource, build_job, sampler_state
from .gather import Part, Snapshot, gather
from .prepared import Prepared
from .ramtier import RamPolicy, RamTier, default_staging_bytes
from .recovery import Recovered
from .sealed import SealedLayout


class WriterState:
    """The state of one writer's segment (``SegmentState`` is its older name).

    Invariants: ``commit.n_rows <= index.n_rows``; with a tier, ``tier.hi ==
    index.n_rows`` between adds (an add reserves tier rows first and publishes them to the
    index last), rows ``[tier.lo, tier.hi)`` are in RAM and visible rows ``>=
    commit.n_rows`` are only there (the tier drops an uncommitted row only once it is
    evicted, and an evicted row is never written from it); trajectory ids (``next_trajectory_id``),
    episode ids (``next_episode``) and rows only grow: nothing is ever renumbered, except
    that :meth:`reopen` replaces everything with what a commit on disk says.
    """

    def __init__(
        self,
        writer_id: str,
        opened: Recovered,
        ram: RamPolicy,
        capacity,
        staging_bytes: int | None = None,
    ):
        self.writer_id = writer_id
        self.ram = ram
        self.capacity = capacity
        self.staging_bytes = default_staging_bytes() if staging_bytes is None else staging_bytes
        if self.staging_bytes < 0:
            raise ValueError(f"staging_bytes must be >= 0, got {staging_bytes}")
        # The buffer's sealed segments sampled beside this one (set by the writer once it
        # opened them; a clear or a load of this segment leaves them).
        self.sealed: SealedLayout | None = None
        self.reopen(opened)

    def reopen(self, o: Recovered) -> None:
        """Take the segment as opened from disk (open, clear, adopt)."""
        old = getattr(self, "columns", None)
        old_id = self._cache_id() if old is not None and self.segment is not None else None
        self.schema: Schema | None = o.schema
        self.layouts = o.layouts
        self.commit: Commit = o.commit
        self.segment: Segment | None = o.segment
        self.index = o.index
        self.lanes = o.lanes
        self.next_trajectory_id = o.next_trajectory_id
        self.next_episode = o.next_episode
        self.tier: RamTier | None = None
        if old is not None and old_id != self._cache_id():
            old.discard(old_id)  # the rows it held are gone (a clear, a loaded checkpoint)
        self.columns = self._column_cache()
        self._ident_of, self._ident = None, None
        self._space_of: tuple | None = None  # (index, its low, its n, the space built for them)
        self.tier_rows = 0  # the tier's size by the RAM policy (the ring may grow beyond)
        # Trajectory counts at which an add's batch ends: a commit never splits a batch.
        self.batch_ends: list[int] = []
        if self.index.n:
            self.make_tier(o.largest_trajectory)

    def empty_to(self, commit: Commit) -> None:
        """Take ``commit`` (of a clear: nothing visible) as the segment's state, before its
        arrays are opened again (a failure in between leaves no stale index behind)."""
        self.reopen(Recovered.empty(commit, self.schema, self.layouts, commit.next_trajectory_id))

    def set_schema(self, schema: Schema | None, layouts, segment: Segment | None) -> None:
        self.schema, self.layouts, self.segment = schema, layouts, segment
        self.columns = self._column_cache()

    def _column_cache(self) -> ColumnCache | None:
        """Small keys of committed rows below the RAM tier, decoded on first use."""
        if self.schema is None or self.ram.column_budget <= 0:
            return None
        # A writer samples under its lock: never behind another process's fill.
        return ColumnCache(self.schema, self.ram.column_budget, wait=False)

    def _cache_id(self) -> str | None:
        """What names the committed rows for the column cache's file (see
        :func:`~zreplay.engine.colcache.contents_ident`), resolved once per contents."""
        contents = self.commit.contents
        if self._ident_of != contents:
            self._ident_of = contents
            self._ident = contents_ident(self.segment.dir, contents) if self.segment else None
        return self._ident

    def set_commit(self, commit: Commit, job: Job | None = None) -> None:
        """``commit`` was published (for ``job``, announcing a reclaim, or by the writer).
        Committed rows beyond the RAM policy's window leave the tier (all of them with the
        RAM tier off; the rows of a batch larger than the window once it is on disk)."""
        self.commit = commit
        if job is not None and self.tier is not None:
            self.tier.release_committed(commit.n_rows)
            self._give_back()

    # -- the RAM tier ---------------------------------------------------------------

    @property
    def staging_rows(self) -> int:
        """Rows ``staging_bytes`` holds."""
        return self.staging_bytes // max(1, self.schema.row_bytes)

    def make_tier(self, traj_rows: int) -> None:
        self.tier_rows = self.ram.rows_for(self.schema, traj_rows, self.staging_rows, self.capacity)
        window = self.ram.window_for(self.schema, traj_rows, self.capacity)
        self.tier = RamTier(self.schema, self.tier_rows, window)
        self.tier.reset(self.index.n_rows)

    def tier_too_small(self, items: list[Prepared]) -> int | None:
        """Rows of a larger RAM tier an add of ``items`` needs, or None if the current one
        will do: it stages the whole batch at once, and was sized by the policy for
        trajectories as large as its largest (else it grows to the policy's size for it,
        or to the batch while that is larger: given back once it is committed)."""
        largest = max(it.n_rows for it in items)
        total = sum(it.n_rows for it in items)
        policy = self.ram.rows_for(self.schema, largest, self.staging_rows, self.capacity)
        if policy <= self.tier_rows and total <= self.tier.capacity:
            return None
        return max(policy, total)

    def regrow_tier(self, items: list[Prepared], rows: int) -> RamTier:
        """A tier of ``rows`` rows holding what the current one holds (the caller waited
        until every row the current tier holds is committed); its sampling window is the
        policy's for the largest of ``items`` if that is larger.  Slots beyond the
        policy's size (a batch larger than it) are given back after their commit."""
        largest = max(it.n_rows for it in items)
        window = max(self.tier.window, self.ram.window_for(self.schema, largest, self.capacity))
        policy = self.ram.rows_for(self.schema, largest, self.staging_rows, self.capacity)
        self.tier_rows = max(self.tier_rows, min(policy, rows))
        self.tier = self.tier.resized(rows, window)
        return self.tier

    def _give_back(self) -> None:
        """Once everything is committed, a ring grown past the policy's size plus the
        staging budget (for a batch larger than both) shrinks back to the policy's size,
        keeping the newest committed rows of its window."""
        tier = self.tier
        if tier is None or self.commit.n_rows < tier.hi:
            return
        if tier.capacity > self.tier_rows + self.staging_rows:
            self.tier = tier.resized(self.tier_rows)

    def staging_room(self, k: int) -> RamTier:
        """The tier an add of ``k`` rows reserves in.  When its rows would overwrite
        uncommitted ones, the ring first grows (once, copying what it holds) to the tier
        plus ``staging_bytes`` of staging slots, so adds wait for the committer only once
        the uncommitted rows fill both.  The window (what stays in RAM once committed)
        does not change."""
        tier = self.tier
        if tier.hi + k - tier.capacity <= self.commit.n_rows:
            return tier
        staged = self.staging_rows
        target = self.tier_rows + staged
        if staged >= k and target > tier.capacity:
            self.tier = tier.resized(target)
        return self.tier

    def empty_tier(self) -> None:
        """Drop the tier's rows (they stay readable from disk)."""
        if self.tier is not None:
            self.tier = RamTier(self.schema, self.tier.capacity, self.tier.window)
            self.tier.reset(self.index.n_rows)

    def preload_rows(self) -> tuple[RamTier, RowRange] | None:
        """``(tier, rows)``: committed rows the RAM tier should hold but does not (right
        after a reopen: the newest rows that fit), or None."""
        tier = self.tier
        if not self.ram.enabled or tier is None:
            return None
        lo = max(self.index.low_row, tier.room_below())
        hi = min(tier.lo, self.commit.n_rows)
        return (tier, RowRange(lo, hi)) if lo < hi else None

    def put_preloaded(self, tier: RamTier, block: RowRange, rows: dict) -> bool:
        """The rows of ``block`` read back from disk (``rows``: every key's, env-major)
        enter the tier (``block.stop`` must be its first row), as far as they are still
        visible and fit; False once nothing more can go in (the tier was replaced or
        moved on, or has no room below)."""
        if tier is not self.tier or not self.ram.enabled or tier.lo != block.stop:
            return False
        lo = max(block.start, self.index.low_row, tier.room_below())
        n = tier.lo - lo
        if n <= 0:
            return False
        tier.put_below(lo, {k: r[len(r) - n :] for k, r in rows.items()})
        return lo == block.start

    # -- adding ---------------------------------------------------------------------

    def publish(self, items: list[Prepared], start: int) -> list[int]:
        """Publish ``items``, whose rows were copied to tier rows from ``start`` on (one
        after the other): assign their ids, cut their episodes, append them to the index
        and evict down to ``capacity``.  All of them or none: everything that can fail
        runs before the first change.  Returns their trajectory ids."""
        next_id, lanes, next_episode, row = (
            self.next_trajectory_id,
            self.lanes,
            self.next_episode,
            start,
        )
        entries, ids = [], []
        for it in items:
            tid = next_id if it.trajectory_id is None else int(it.trajectory_id)
            if tid > INT64_MAX:  # ids are int64: the one past the last is no id
                raise CapacityError(
                    f"this segment's trajectory ids are used up (the next would be {tid}, "
                    "past the largest int64); nothing was added. Give trajectory ids "
                    "explicitly, or write to another writer_id"
                )
            next_id = max(next_id, tid + 1)
            pieces, lanes, next_episode = split_pieces(
                it.columns,
                it.T,
                it.B,
                row,
                next_episode,
                lanes=lanes,
                continues=it.continues,
                split=it.split_episodes,
            )
            entries.append((it.T, it.B, tid, it.max_episode_length, it.weights_bytes, pieces))
            ids.append(tid)
            row += it.n_rows
        self.index.append_many(entries)
        self.batch_ends.append(self.index.n)
        self.next_trajectory_id, self.lanes, self.next_episode = next_id, lanes, next_episode
        if self.capacity is not None:
            self.index.evict_to(self.capacity)
            self.tier.release_below(self.index.low_row)
        return ids

    def reserve_trajectory_ids(self, stop: int) -> None:
        """Never hand out trajectory ids below ``stop``."""
        self.next_trajectory_id = max(self.next_trajectory_id, int(stop))

    # -- commits --------------------------------------------------------------------

    def next_job(self, source: StateSource | None, explicit: bool, space=None) -> Job:
        """The next commit's job, with the sampler state and the priorities to save
        (``space()``: the visible rows, for the priorities)."""
        self.batch_ends = [e for e in self.batch_ends if e > self.commit.n_traj]
        job = build_job(
            self.writer_id,
            self.index,
            self.commit,
            self.tier,
            self.schema,
            self.segment,
            self.next_trajectory_id,
            self.next_episode,
            self.batch_ends,
        )
        job.commit.sampler, job.priorities = self.sampler_state(
            source, job.commit.n_rows, explicit, space
        )
        return job

    def sampler_state(self, source, n_rows: int | None = None, explicit: bool = False, space=None):
        """``(state, priorities to save)`` for a commit after the current one."""
        named = self.commit.sampler.get("priority")
        return sampler_state(source, named, n_rows, explicit, self.commit.sampler, space)

    def next_commit_base(self) -> Commit:
        """The current commit with the next rows and ids this segment would give (what a
        replacement built aside continues from)."""
        return Commit(
            writer_id=self.writer_id,
            gen=self.commit.gen,
            n_rows=self.index.n_rows,
            next_trajectory_id=self.next_trajectory_id,
            next_episode=self.next_episode,
            writer_number=self.commit.writer_number,
            inserted=self.commit.inserted,
        )

    def cleared_commit(self, source) -> Commit:
        """The commit of this segment emptied: no trajectory is visible, and rows,
        trajectory and episode ids go on from where they are (never reused); every row
        so far counts as reclaimed, and no saved priority is named.  The next row is the
        first of a fresh shard of every key, so new rows never share a chunk with deleted
        ones (a reader still holding an old snapshot finds its rows missing, not zeros)."""
        old, rows = self.commit, self.index.n_rows
        if self.layouts:
            unit = math.lcm(*(lay.shard_rows for lay in self.layouts.values()))
            rows = -(-rows // unit) * unit
        state = sampler_state(source, None, None, False, old.sampler)[0]
        state.pop("priority", None)
        return Commit(
            writer_id=self.writer_id,
            gen=old.gen + 1,
            n_rows=rows,
            low_row=rows,
            reclaimed_below=rows,
            next_trajectory_id=self.next_trajectory_id,
            next_episode=self.next_episode,
            writer_number=old.writer_number,
            sampler=state,
            contents=new_contents(),
            inserted=old.inserted,
        )

    # -- reading --------------------------------------------------------------------

    def snapshot(self, persisted) -> Snapshot:
        """The visible rows now; ``persisted()`` gives the priorities the commit names."""
        idx, tier = self.index, self.tier
        lo, hi = idx.low_row, idx.n_rows
        tier_lo = tier.lo if tier is not None else hi
        part = Part(
            segment=self.segment,
            index=idx,
            low_row=lo,
            n_rows=hi,
            first=0,  # positions run from its oldest visible row, as a view's do
            tier=tier,
            tier_lo=tier_lo,
            cache=self.columns,
            cache_hi=min(self.commit.n_rows, tier_lo),  # uncommitted rows: the tier's
            cache_id=self._cache_id(),
        )
        if self.sealed is not None:  # the offline part's segments beside this one
            return self.sealed.snapshot(part, self.schema, persisted)
        return Snapshot(self.schema, [part], idx.episodes, None, space=self._space(persisted))

    def _space(self, persisted) -> RowSpace:
        """The visible rows as sampler positions, built once per change of the index (an
        add, an eviction, a clear or a load) rather than per draw: a sample only reads it."""
        idx = self.index
        got = self._space_of
        if got is not None and got[0] is idx and got[1] == idx.low and got[2] == idx.n:
            return got[3]
        lo, hi = idx.low_row, idx.n_rows
        # The index stands for its rows' epoch: a clear or a load makes a new one.
        seg = VisibleRows(
            key=0, epoch=idx, low_row=lo, n_rows=hi, first=0, persisted=persisted, index=idx
        )
        # A stored column is read through the snapshot of the moment it is read (the
        # caller holds the writer's lock): this space outlives the snapshot it came with.
        space = RowSpace.of_index(
            idx, seg, lambda key, pos: gather(self.snapshot(persisted), {key: (key, pos)})[key]
        )
        self._space_of = (idx, idx.low, idx.n, space)
        return space

    def stats(self) -> dict:
        """Counts: visible trajectories/rows (sealed segments' included), what the RAM tier
        holds (whole trajectories and rows), what is committed and what is still pending
        (of this segment)."""
        idx, tier, commit = self.index, self.tier, self.commit
        first_in_ram = max(tier.lo if tier is not None else idx.n_rows, idx.low_row)
        in_ram = int(np.searchsorted(idx.offsets, first_in_ram, "left")) if idx.n else 0
        return {
            "trajectories": idx.num_visible,
            "rows": idx.visible_rows,
            "trajectories_in_ram": idx.n - max(in_ram, idx.low) if idx.n else 0,
            "rows_in_ram": max(0, idx.n_rows - first_in_ram),
            "ram_bytes": 0 if tier is None else tier.nbytes,
            "committed_trajectories": commit.n_traj - commit.low_traj,
            "pending_trajectories": idx.n - commit.n_traj,
            **self._sealed_stats(),
        }

    def _sealed_stats(self) -> dict:
        """With sealed segments beside this one: ``trajectories`` and ``rows`` count theirs
        too (as ``num_rows`` does), and ``offline_trajectories``/``offline_rows`` say how
        many are theirs."""
        sealed = self.sealed
        if sealed is None:
            return {}
        idx = self.index
        return {
            "trajectories": idx.num_visible + sealed.trajectories,
            "rows": idx.visible_rows + sealed.rows,
            "offline_trajectories": sealed.trajectories,
            "offline_rows": sealed.rows,
        }


SegmentState = WriterState  # its name until issue 34 (tests patch it by that name)
