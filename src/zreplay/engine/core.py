"""The engine: one writable segment, its in-RAM index, the RAM tier and the background writer.

Life of a trajectory:

1. ``add`` (caller's thread): rows are reserved, copied env-major into the RAM tier and
   published to the in-RAM index, so in-process sampling sees them at once.
2. The writer thread writes every published-but-uncommitted row range and index entry
   through TensorStore, then atomically replaces ``commit.json``.  Only then may the RAM
   tier overwrite those rows (backpressure instead of data loss).
3. ``gather`` serves rows from the RAM tier with one fancy index per key (under the lock,
   so a concurrent ``add`` can never tear a row) and the rest from disk with one batched
   read per key over sorted unique rows.

Facades (RLinf's TrajectoryReplayBuffer, the dataset view) sit on top of this class.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..episodes import Lanes, lanes_after, split_pieces
from ..errors import (
    BufferClosedError,
    CapacityError,
    CorruptBufferError,
    SchemaError,
    WriteFailedError,
)
from ..index import TrajectoryIndex, time_major
from ..sampling import group_requests
from ..schema import Schema
from ..store.commit import Commit, read_commit, remove_orphans, write_commit
from ..store.layout import layouts_for
from ..store.location import location, options_of, remove_tree
from ..store.lock import WriterLock
from ..store.root import ID_BITS, BufferRoot
from ..store.segment import WEIGHTS_ID_BYTES, Segment
from .committer import Committer
from .ramtier import RamPolicy, RamTier

log = logging.getLogger("zreplay")

_LIVE: weakref.WeakSet = weakref.WeakSet()


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not on this platform: no check
        return 1 << 62


_PHYSICAL_MEMORY = _physical_memory()


def _weak_method(method: Callable[[], dict]) -> Callable[[], dict]:
    ref = weakref.WeakMethod(method)
    return lambda: (ref() or dict)()


@atexit.register
def _close_live_engines() -> None:
    # Daemon writer threads still run during atexit, so unclosed buffers commit what was
    # added instead of losing it (and never hang in a __del__ during finalization).
    for eng in list(_LIVE):
        try:
            eng.close()
        except Exception as e:  # noqa: BLE001 - best effort at exit
            log.error("zreplay: closing %s at exit failed: %r", eng.path, e)


@dataclass
class Prepared:
    """A validated trajectory: ``[T, B, ...]`` numpy columns by key path, plus metadata."""

    columns: dict[str, np.ndarray]
    T: int
    B: int
    max_episode_length: int = 0
    model_weights_id: str = ""
    trajectory_id: int | None = None
    # Lanes whose first step continues the episode the same lane of the writer's previous
    # trajectory left open (bool or [B] bools); split_episodes=False: one episode per lane.
    continues: object = False
    split_episodes: bool = True
    weights_bytes: bytes = field(init=False, default=b"")

    def __post_init__(self):
        self.weights_bytes = str(self.model_weights_id).encode("utf-8")
        if len(self.weights_bytes) > WEIGHTS_ID_BYTES:
            raise SchemaError(
                f"model_weights_id {self.model_weights_id!r} is longer than "
                f"{WEIGHTS_ID_BYTES} bytes of UTF-8; use a shorter id (a uuid fits)"
            )

    @property
    def n_rows(self) -> int:
        return self.T * self.B


class Engine:
    """A writable buffer segment with in-process readers. Thread-safe."""

    def __init__(
        self,
        path: str | Path | None,
        *,
        writer_id: str = "default",
        capacity: int | None = None,
        ram: RamPolicy | None = None,
        layout: Mapping[str, Mapping] | None = None,
        durable: bool = True,
        overwrite: bool = False,
        break_lock: bool = False,
        sampler_state: Callable[[], dict] | None = None,
        storage_options: Mapping | None = None,
        sampler_persist: Callable[[int, bool], tuple[dict, Callable | None]] | None = None,
    ):
        self.temporary = path is None
        if self.temporary:
            path = tempfile.mkdtemp(prefix="zreplay-")
            # Removed on close(), or at interpreter exit if the owner never closed it.
            self._finalizer = weakref.finalize(self, shutil.rmtree, path, ignore_errors=True)
        self.root = BufferRoot(path, storage_options)
        self.path = self.root.path
        self.writer_id = writer_id
        self.capacity = capacity
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be a positive number of rows, got {capacity}")
        self.ram = ram or RamPolicy()
        self.durable = durable
        self._layout_overrides = dict(layout or {})
        # Held weakly: the writer thread must not keep the owning facade alive (its
        # __del__ closes the buffer); once the owner is gone the state is empty.
        self.sampler_state = _weak_method(sampler_state) if sampler_state else (lambda: {})
        # (commit n_rows, explicit flush) -> (entries for the commit's sampler state, a
        # write run on the writer thread before the commit is published, or None).
        self.sampler_persist = sampler_persist or (lambda _n, _explicit: ({}, None))

        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._add_lock = threading.Lock()
        self._closed = False

        if overwrite and self.path.exists() and not self.temporary:
            self._remove_tree_if_buffer()
        self.root.create()
        self.seg_dir = self.root.segment_dir(writer_id)
        self.seg_dir.mkdir(parents=True, exist_ok=True)
        self._wlock = WriterLock(self.seg_dir)
        self._wlock.acquire(break_lock=break_lock)
        try:
            self._open_existing()
        except BaseException:
            self._wlock.release()
            raise

        self._committer = Committer(self)
        _LIVE.add(self)

    # -- opening --------------------------------------------------------------------

    def _remove_tree_if_buffer(self) -> None:
        from ..store.root import is_buffer

        if is_buffer(self.path):
            root = BufferRoot(self.path)
            for wid in root.writer_ids():
                info = WriterLock(root.segment_dir(wid)).live_holder()
                if info is not None:
                    from ..errors import WriterLockedError

                    raise WriterLockedError(
                        f"overwrite=True refused: segment {wid!r} of {self.path} is being "
                        f"written by pid {info.get('pid')} on host {info.get('host')!r}; "
                        "close that writer first"
                    )
            remove_tree(self.path)
        elif any(True for _ in self.path.iterdir()):
            from ..errors import FormatError

            raise FormatError(
                f"overwrite=True refused: {self.path} is not a zreplay buffer; delete it yourself"
            )

    def _open_existing(self) -> None:
        self.schema, self.layouts = self.root.schema()
        self.commit = read_commit(self.seg_dir) or Commit(writer_id=self.writer_id)
        if self.commit.writer_number < 0:
            number = self.root.writer_number(self.writer_id)
            self.commit = Commit(**{**vars(self.commit), "writer_number": number})
        committed = {
            str(self.seg_dir / "data" / k / "c"): self.commit.n_rows // lay.shard_rows
            for k, lay in (self.layouts or {}).items()
        }
        remove_orphans(self.seg_dir, committed)
        self.segment: Segment | None = None
        self.tier: RamTier | None = None
        self.index = TrajectoryIndex()
        self.next_trajectory_id = max(
            self.commit.next_trajectory_id, self.commit.writer_number << ID_BITS
        )
        self.next_episode = self.commit.next_episode
        self.lanes: Lanes | None = None
        if self.schema is None:
            return
        missing = Segment.missing_arrays(self.seg_dir, self.schema.specs)
        if missing and self.commit.n_traj:
            # Recreating them would serve fill values as committed data.
            raise CorruptBufferError(
                f"{self.seg_dir}: arrays {missing} are missing, but commit.json says "
                f"{self.commit.n_traj} trajectories were committed; restore the segment from "
                "a checkpoint (zreplay.verify(path) reports all damage)"
            )
        self._open_segment()
        if self.commit.reclaimed_below:
            self.segment.remove_reclaimed(self.commit.reclaimed_below)
        cols = self.segment.read_index(self.commit)
        self.index = TrajectoryIndex(cols, low=self.commit.low_traj)
        if self.index.n:
            i = self.index.n - 1
            p0 = int(cols["piece_end"][i - 1]) if i else 0
            last = {c: v[p0:] for c, v in cols["pieces"].items()}
            self.lanes = lanes_after(
                last, int(self.index.offsets[i]), int(cols["T"][i]), int(cols["B"][i])
            )
            T, B = cols["T"], cols["B"]
            self._make_tier(int((T * B)[self.index.low :].max(initial=1)))
            self._preload_tier()

    def _make_tier(self, traj_rows: int) -> None:
        rows = self.ram.rows_for(self.schema, traj_rows)
        self.tier = RamTier(self.schema, rows)
        self.tier.lo = self.tier.hi = self.index.n_rows

    def _preload_tier(self) -> None:
        """Fill the RAM tier with the newest committed rows (one range read per key)."""
        if not self.ram.enabled or self.tier is None:
            return
        hi = self.index.n_rows
        lo = max(self.index.low_row, hi - self.tier.capacity)
        if hi <= lo:
            return
        futs = {k: self.segment.read_range(k, lo, hi) for k in self.schema.keys}
        for k, f in futs.items():
            self.tier.put_rows(k, lo, f.result())
        self.tier.lo, self.tier.hi = lo, hi

    # -- adding ---------------------------------------------------------------------

    def check(self, items: list[Prepared]) -> Schema:
        """Validate a batch against the schema (inferring it from the first item if new)."""
        self._check_open()
        schema = self.schema
        lanes_b = None if self.lanes is None else len(self.lanes.episode)
        for it in items:
            cont = np.asarray(it.continues, bool)
            if cont.shape not in ((), (it.B,)):
                raise SchemaError(
                    f"continues must be a bool or {it.B} bools (one per environment), got "
                    f"shape {cont.shape}"
                )
            if cont.any() and lanes_b is not None and lanes_b != it.B:
                raise SchemaError(
                    f"continues=True: this trajectory has B={it.B} environments but the "
                    f"previous one has {lanes_b}; episodes can only continue lane by lane"
                )
            lanes_b = it.B
            if it.T <= 0 or it.B <= 0:
                from ..errors import EmptyTrajectoryError

                raise EmptyTrajectoryError(
                    f"trajectory has shape [T={it.T}, B={it.B}]; it must have at least one "
                    "step and one environment"
                )
            if schema is None:
                schema = Schema.infer(it.columns)
            schema.check(it.columns, it.T, it.B)
            nbytes = it.n_rows * schema.row_bytes
            if 2 * nbytes > _PHYSICAL_MEMORY:
                raise CapacityError(
                    f"a trajectory of {it.n_rows} rows (T={it.T} x B={it.B}) holds "
                    f"{nbytes / 2**30:.1f} GiB; the writer stages two trajectories in RAM and "
                    f"this machine has {_PHYSICAL_MEMORY / 2**30:.1f} GiB. Add it in pieces "
                    "(shorter T, with continues=True to keep its episodes whole)"
                )
            if self.capacity is not None and it.n_rows > self.capacity:
                raise CapacityError(
                    f"a trajectory of {it.n_rows} rows (T={it.T} x B={it.B}) exceeds the "
                    f"buffer capacity of {self.capacity} rows; raise capacity or split it"
                )
        return schema

    def _fix_schema(self, schema: Schema, first_rows: int) -> None:
        layouts = layouts_for(schema.specs, self._layout_overrides)
        try:
            self.root.set_schema(schema, layouts)
            self.schema, self.layouts = schema, layouts
            self._open_segment()
        except OSError as e:
            # Both steps are idempotent: the next add completes what this one began.
            self.schema = self.layouts = self.segment = None
            raise WriteFailedError(
                f"could not create the arrays of {self.seg_dir} ({type(e).__name__}: {e}); "
                "nothing was added. Fix the cause (disk space, permissions) and add again"
            ) from e
        self._make_tier(first_rows)

    def _open_segment(self) -> None:
        Segment.create_arrays(self.seg_dir, self.schema.specs, self.layouts)
        self.segment = Segment(
            self.seg_dir, self.schema, self.layouts, writable=True, durable=self.durable
        )

    def add(self, items: list[Prepared]) -> list[int]:
        """Validate, then append trajectories; returns their trajectory ids.

        Nothing is written unless every item passes validation.
        """
        if not items:
            return []
        with self._add_lock:
            schema = self.check(items)
            self._committer.before_add()
            if self.schema is None:
                self._fix_schema(schema, items[0].n_rows)
            elif self.tier is None:
                with self._cond:
                    self._make_tier(items[0].n_rows)
            return [self._add_one(it) for it in items]

    def _add_one(self, it: Prepared) -> int:
        k = it.n_rows
        with self._cond:
            tier = self.tier
            if k * 2 > tier.capacity:
                # Larger trajectories than the tier was sized for: regrow it by the policy.
                self._committer.wait_committed(tier.hi)
                self.tier = tier = tier.resized(self.ram.rows_for(self.schema, k))
            start = tier.hi
            # Rows about to be overwritten must be on disk first.
            self._committer.wait_committed(start + k - tier.capacity)
            tier.hi = start + k
            tier.lo = max(tier.lo, tier.hi - tier.capacity)
        tier.write_trajectory(start, it.columns, it.T, it.B)
        with self._cond:
            if it.trajectory_id is None:
                tid = self.next_trajectory_id
            else:
                tid = int(it.trajectory_id)
            self.next_trajectory_id = max(self.next_trajectory_id, tid + 1)
            pieces, self.lanes, self.next_episode = split_pieces(
                it.columns,
                it.T,
                it.B,
                start,
                self.next_episode,
                lanes=self.lanes,
                continues=it.continues,
                split=it.split_episodes,
            )
            self.index.append(it.T, it.B, tid, it.max_episode_length, it.weights_bytes, pieces)
            if self.capacity is not None:
                self.index.evict_to(self.capacity)
                tier.lo = max(tier.lo, self.index.low_row)
            self._committer.request()
        return tid

    def flush(self) -> None:
        """Block until everything added so far is committed (and the sampler state saved)."""
        with self._cond:
            self._check_open()
        self._committer.flush()

    # -- reading --------------------------------------------------------------------

    def gather(self, rows: np.ndarray, keys: list[str] | None = None) -> dict[str, np.ndarray]:
        """Rows (global, visible) of each key as ``[len(rows), *row_shape]`` arrays."""
        rows = np.asarray(rows, np.int64)
        return self.draw_and_gather(lambda _index: rows, keys)[1]

    def draw_and_gather(
        self,
        draw: Callable[[TrajectoryIndex], object],
        keys: list[str] | None = None,
        alloc: Callable[[str, tuple, np.dtype], np.ndarray] | None = None,
    ) -> tuple[object, dict[str, np.ndarray]]:
        """Call ``draw(index)`` under the lock, then gather what it asks for.

        ``draw`` returns either global rows (every key in ``keys`` is gathered at them) or
        requests ``{name: (key, rows of any shape)}`` (output ``name`` has shape
        ``rows.shape + row_shape``).  Drawing under the same lock that guards eviction means
        every drawn row is still readable when it is read: no sample ever mixes fields of
        different transitions.  ``alloc(name, shape, dtype)`` provides each output array
        (e.g. pinned memory); rows are gathered straight into it.
        """
        alloc = alloc or (lambda _name, shape, dtype: np.empty(shape, dtype))
        with self._cond:
            self._check_open()
            drawn = draw(self.index)
            if self.schema is None:
                return drawn, {}
            if isinstance(drawn, dict):
                requests = drawn
            else:
                drawn = np.asarray(drawn, np.int64)
                requests = {k: (k, drawn) for k in (self.schema.keys if keys is None else keys)}
            out, dst = {}, {}  # dst: each output viewed as [rows, *row_shape]
            for name, (key, r) in requests.items():
                spec = self.schema.specs[key]
                out[name] = alloc(name, (*r.shape, *spec.row_shape), spec.dtype)
                dst[name] = out[name].reshape(r.size, *spec.row_shape)
            tier = self.tier
            tier_lo = tier.lo if tier is not None else self.index.n_rows
            disk = []
            for r, members in group_requests(requests):
                flat = np.asarray(r, np.int64).reshape(-1)
                in_tier = flat >= tier_lo
                if in_tier.all():
                    slots = tier.slots(flat)
                    for name, key in members:
                        tier.gather(key, slots, out=dst[name])
                    continue
                if in_tier.any():
                    sel = np.nonzero(in_tier)[0]
                    slots = tier.slots(flat[sel])
                    for name, key in members:
                        dst[name][sel] = tier.gather(key, slots)
                disk.append((flat, np.nonzero(~in_tier)[0], members))
            if not disk:
                return drawn, out
            self._committer.begin_disk_read()
        try:
            pending = []
            for flat, miss, members in disk:  # every read in flight before waiting
                uniq, inv = np.unique(flat[miss], return_inverse=True)
                futs = {key: self.segment.read_rows(key, uniq) for _, key in members}
                pending.append((flat, miss, inv, members, futs))
            for flat, miss, inv, members, futs in pending:
                for name, key in members:
                    if len(miss) == len(flat):
                        np.take(futs[key].result(), inv, axis=0, out=dst[name], mode="clip")
                    else:
                        dst[name][miss] = futs[key].result()[inv]
        finally:
            self._committer.end_disk_read()
        return drawn, out

    def locked(self, fn: Callable[[TrajectoryIndex], object]) -> object:
        """``fn(index)`` under the lock: nothing is added or evicted while it runs."""
        with self._cond:
            self._check_open()
            return fn(self.index)

    def stats(self) -> dict:
        """Counts at one instant: visible trajectories/rows, what the RAM tier holds
        (whole trajectories and rows), what is committed and what is still pending."""
        with self._lock:
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
                "path": None if self.temporary else str(self.path),
            }

    def read_trajectory(self, i: int, keys: list[str] | None = None) -> dict[str, np.ndarray]:
        """Trajectory ``i`` as ``[T, B, ...]`` arrays."""
        idx = self.index
        lo, hi = int(idx.offsets[i]), int(idx.offsets[i + 1])
        T, B = int(idx.column("T")[i]), int(idx.column("B")[i])
        flat = self.gather(np.arange(lo, hi), keys)
        return {k: time_major(v, T, B) for k, v in flat.items()}

    # -- lifecycle ------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise BufferClosedError(
                "this buffer was closed; create a new TrajectoryReplayBuffer on the same "
                "path (or zreplay.open(path)) to use its data again"
            )

    def clear(self, reset_schema: bool = False) -> None:
        """Remove every trajectory of this segment, on disk too.

        Trajectory ids keep counting up (ids are never reused).  The schema is kept unless
        ``reset_schema`` (allowed only when no other segment of the buffer exists).
        """
        with self._add_lock:
            self.flush()
            with self._cond:
                self._clear_locked(reset_schema)

    def _clear_locked(self, reset_schema: bool) -> None:
        if reset_schema and set(self.root.writer_ids()) - {self.writer_id}:
            raise SchemaError(
                f"{self.path} has other writers' segments; their schema cannot be reset"
            )
        self.root.remove_segment_data(self.writer_id)
        self.commit = Commit(
            writer_id=self.writer_id,
            gen=self.commit.gen + 1,
            next_trajectory_id=self.next_trajectory_id,
            writer_number=self.commit.writer_number,
            sampler=self.sampler_state(),
        )
        write_commit(self.seg_dir, self.commit, durable=self.durable)
        if reset_schema:
            self.root.replace_schema(None, None)
        self._open_existing()

    def checkpoint(self, dest: str | Path) -> None:
        """Write a complete, consistent copy-free snapshot of this segment to ``dest``."""
        from ..store.snapshot import write_snapshot

        with self._add_lock:
            self.flush()
            with self._cond:
                commit = Commit(**{**vars(self.commit), "sampler": self.sampler_state()})
            dest = location(dest, options_of(self.path))
            write_snapshot(self.path, self.writer_id, commit, dest, self.durable)

    def adopt(self, src_root, src_writer: str, first: int, stop: int, sampler: dict) -> None:
        """Replace this segment's contents with trajectories ``[first, stop)`` of a
        zreplay segment, by hard-linking its files (no data copy)."""
        from ..store.snapshot import link_tree

        src = BufferRoot(src_root)
        schema, layouts = src.schema()
        src_dir = src.segment_dir(src_writer)
        src_commit = read_commit(src_dir)
        cols = Segment(src_dir, schema, layouts, writable=False).read_index(src_commit)
        off, ends = cols["offsets"], cols["piece_end"]
        with self._add_lock:
            self.flush()
            with self._cond:
                self._clear_locked(reset_schema=True)
                self.root.remove_segment_data(self.writer_id)
                link_tree(src_dir, self.seg_dir)
                self.root.replace_schema(schema, layouts)
                self.commit = Commit(
                    writer_id=self.writer_id,
                    gen=self.commit.gen + 1,
                    n_rows=int(off[stop]),
                    n_traj=stop,
                    low_row=int(off[first]),
                    low_traj=first,
                    reclaimed_below=src_commit.reclaimed_below,
                    next_trajectory_id=max(self.next_trajectory_id, src_commit.next_trajectory_id),
                    n_pieces=int(ends[stop - 1]) if stop else 0,
                    low_piece=int(ends[first - 1]) if first else 0,
                    next_episode=src_commit.next_episode,
                    writer_number=self.commit.writer_number,
                    sampler=sampler,
                )
                write_commit(self.seg_dir, self.commit, durable=self.durable)
                self._open_existing()

    def drop_ram(self) -> None:
        """Release the RAM tier's committed rows (they stay readable from disk)."""
        with self._add_lock:  # no add may be copying into the tier we replace
            self.flush()
            with self._cond:
                if self.tier is not None:
                    self.tier = RamTier(self.schema, self.tier.capacity)
                    self.tier.lo = self.tier.hi = self.index.n_rows

    def close(self) -> None:
        """Commit everything added, save the sampler state, stop the writer, unlock."""
        with self._add_lock:  # an add in flight finishes (and is committed) first
            if self._closed:
                return
            try:
                self.flush()
            finally:
                self._committer.stop()
                self._closed = True
                self._wlock.release()
                if self.temporary:
                    self._finalizer()

    @property
    def closed(self) -> bool:
        return self._closed
