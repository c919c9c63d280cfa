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
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import (
    BufferClosedError,
    CapacityError,
    SchemaError,
    WriteFailedError,
)
from ..index import TrajectoryIndex
from ..schema import Schema
from ..store.commit import Commit, read_commit, remove_orphans, write_commit
from ..store.layout import layouts_for
from ..store.lock import WriterLock
from ..store.root import BufferRoot
from ..store.segment import WEIGHTS_ID_BYTES, Segment
from .ramtier import RamTier

log = logging.getLogger("zreplay")

_LIVE: weakref.WeakSet = weakref.WeakSet()


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


@dataclass
class RamPolicy:
    """How many recent rows the RAM tier keeps decoded.

    ``trajectories``: keep about this many of the newest trajectories (sized from the
    first one); ``max_bytes``: cap on the tier's size; ``enabled=False`` keeps only rows
    that are not yet committed, so every sample of committed data reads from disk.
    """

    enabled: bool = True
    trajectories: int | None = 5
    max_bytes: int | None = None

    def rows_for(self, schema: Schema, traj_rows: int) -> int:
        staging = 2 * traj_rows
        if not self.enabled:
            return staging
        rows = (self.trajectories or 0) * traj_rows
        if self.max_bytes is not None:
            budget = self.max_bytes // max(1, schema.row_bytes)
            rows = budget if not self.trajectories else min(rows, budget)
        return max(staging, rows)


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
    ):
        self.temporary = path is None
        if self.temporary:
            path = tempfile.mkdtemp(prefix="zreplay-")
            # Removed on close(), or at interpreter exit if the owner never closed it.
            self._finalizer = weakref.finalize(self, shutil.rmtree, path, ignore_errors=True)
        self.root = BufferRoot(path)
        self.path = self.root.path
        self.writer_id = writer_id
        self.capacity = capacity
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be a positive number of rows, got {capacity}")
        self.ram = ram or RamPolicy()
        self.durable = durable
        self._layout_overrides = dict(layout or {})
        self.sampler_state = sampler_state or (lambda: {})

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

        self._want_gen = self._done_gen = 0
        self._error: BaseException | None = None
        self._disk_readers = 0
        self._reclaiming = False
        self._stop = False
        self._thread = threading.Thread(
            target=self._writer_loop, name="zreplay-writer", daemon=True
        )
        self._thread.start()
        _LIVE.add(self)

    # -- opening --------------------------------------------------------------------

    def _remove_tree_if_buffer(self) -> None:
        from ..store.root import is_buffer

        if is_buffer(self.path):
            shutil.rmtree(self.path)
        elif any(self.path.iterdir()):
            from ..errors import FormatError

            raise FormatError(
                f"overwrite=True refused: {self.path} is not a zreplay buffer; delete it yourself"
            )

    def _open_existing(self) -> None:
        remove_orphans(self.seg_dir)
        self.schema, self.layouts = self.root.schema()
        self.commit = read_commit(self.seg_dir) or Commit(writer_id=self.writer_id)
        self.segment: Segment | None = None
        self.tier: RamTier | None = None
        self.index = TrajectoryIndex()
        self.next_trajectory_id = self.commit.next_trajectory_id
        if self.schema is None:
            return
        self._open_segment()
        cols = self.segment.read_index(self.commit)
        self.index = TrajectoryIndex(cols, low=self.commit.low_traj)
        if self.index.n:
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
        for it in items:
            if it.T <= 0 or it.B <= 0:
                from ..errors import EmptyTrajectoryError

                raise EmptyTrajectoryError(
                    f"trajectory has shape [T={it.T}, B={it.B}]; it must have at least one "
                    "step and one environment"
                )
            if schema is None:
                schema = Schema.infer(it.columns)
            schema.check(it.columns, it.T, it.B)
            if self.capacity is not None and it.n_rows > self.capacity:
                raise CapacityError(
                    f"a trajectory of {it.n_rows} rows (T={it.T} x B={it.B}) exceeds the "
                    f"buffer capacity of {self.capacity} rows; raise capacity or split it"
                )
        return schema

    def _fix_schema(self, schema: Schema, first_rows: int) -> None:
        layouts = layouts_for(schema.specs, self._layout_overrides)
        self.root.set_schema(schema, layouts)
        self.schema, self.layouts = schema, layouts
        self._open_segment()
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
            self._raise_writer_error()
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
                self._wait_committed(tier.hi)
                self.tier = tier = tier.resized(self.ram.rows_for(self.schema, k))
            start = tier.hi
            # Rows about to be overwritten must be on disk first.
            self._wait_committed(start + k - tier.capacity)
            tier.hi = start + k
            tier.lo = max(tier.lo, tier.hi - tier.capacity)
        tier.write_trajectory(start, it.columns, it.T, it.B)
        with self._cond:
            if it.trajectory_id is None:
                tid = self.next_trajectory_id
            else:
                tid = int(it.trajectory_id)
            self.next_trajectory_id = max(self.next_trajectory_id, tid + 1)
            self.index.append(it.T, it.B, tid, it.max_episode_length, it.weights_bytes)
            if self.capacity is not None:
                self.index.evict_to(self.capacity)
                tier.lo = max(tier.lo, self.index.low_row)
            self._want_gen += 1
            self._cond.notify_all()
        return tid

    def _wait_committed(self, row: int) -> None:
        """Block (lock held, via the condition) until rows below ``row`` are committed."""
        while self.commit.n_rows < row:
            self._raise_writer_error()
            if self._stop:
                raise BufferClosedError("buffer is closing")
            self._cond.wait(0.5)

    # -- the writer thread ----------------------------------------------------------

    def _writer_loop(self) -> None:
        while True:
            with self._cond:
                while (self._done_gen >= self._want_gen or self._error) and not self._stop:
                    self._cond.wait()
                if self._stop and (self._done_gen >= self._want_gen or self._error):
                    return
                target = self._want_gen
                job = self._snapshot_job()
            try:
                self._write_job(job)
            except BaseException as e:  # surfaced to the caller by flush()/add()
                log.error("zreplay writer failed: %r", e)
                with self._cond:
                    self._error = e
                    self._cond.notify_all()
                continue
            with self._cond:
                self.commit = job["commit"]
                if job["complete"]:
                    self._done_gen = target
                if not self.ram.enabled and self.tier is not None:
                    self.tier.lo = max(self.tier.lo, self.commit.n_rows)
                self._cond.notify_all()
            self._reclaim(job["commit"])

    def _snapshot_job(self) -> dict:
        """What the next commit covers: whole trajectories published since the last one,
        at most about a quarter of the RAM tier, so adds waiting for room are released
        progressively instead of after one huge commit."""
        idx, old = self.index, self.commit
        first = min(old.n_traj, idx.n)
        stop = idx.n
        if self.tier is not None and stop > first:
            budget = old.n_rows + max(1, self.tier.capacity // 4)
            stop = max(first + 1, int(np.searchsorted(idx.offsets, budget, side="right")) - 1)
            stop = min(stop, idx.n)
        low = min(idx.low, stop)
        columns = idx.columns_range(first, stop)
        next_id = self.next_trajectory_id
        if stop < idx.n:  # ids of trajectories this commit does not cover stay unclaimed
            next_id = max(old.next_trajectory_id, int(columns["trajectory_id"].max()) + 1)
        new = Commit(
            writer_id=self.writer_id,
            gen=old.gen + 1,
            n_rows=int(idx.offsets[stop]),
            n_traj=stop,
            low_row=int(idx.offsets[low]),
            low_traj=low,
            reclaimed_below=old.reclaimed_below,
            next_trajectory_id=next_id,
            sampler=self.sampler_state(),
        )
        return {
            "commit": new,
            "complete": stop == idx.n,
            "rows": (old.n_rows, new.n_rows),
            "first_traj": first,
            "offsets": idx.offsets[first + 1 : stop + 1].copy(),
            "columns": columns,
            "tier": self.tier,
        }

    def _write_job(self, job: dict) -> None:
        new: Commit = job["commit"]
        if self.segment is not None:
            start, stop = job["rows"]
            self.segment.ensure_capacity(new.n_rows, new.n_traj)
            futs = []
            for key in self.schema.keys if stop > start else ():
                for row0, piece in job["tier"].read_range(key, start, stop):
                    futs.append(self.segment.write_rows(key, row0, piece))
            futs += self.segment.write_index(job["first_traj"], job["offsets"], job["columns"])
            for f in futs:
                f.result()
        write_commit(self.seg_dir, new, durable=self.durable)

    def _reclaim(self, commit: Commit) -> None:
        """Delete shards that hold only evicted rows, once no in-process read needs them."""
        if self.segment is None or commit.low_row <= commit.reclaimed_below:
            return
        shard = min(lay.shard_rows for lay in self.layouts.values())
        target = (commit.low_row // shard) * shard
        if target <= commit.reclaimed_below:
            return
        with self._cond:
            if self._disk_readers:
                return
            self._reclaiming = True
        try:
            # Announce first, so readers in other processes can tell their rows are gone.
            announced = Commit(**{**vars(commit), "reclaimed_below": target})
            with self._cond:
                if self.commit.gen != commit.gen:
                    return
                announced.gen = commit.gen + 1
                write_commit(self.seg_dir, announced, durable=self.durable)
                self.commit = announced
            self.segment.reclaim_below(commit.reclaimed_below, target)
        except OSError as e:
            log.warning("zreplay: could not reclaim evicted shards: %r", e)
        finally:
            with self._cond:
                self._reclaiming = False
                self._cond.notify_all()

    def _raise_writer_error(self) -> None:
        if self._error is not None:
            e = self._error
            raise WriteFailedError(
                f"the background writer failed ({type(e).__name__}: {e}); the last commit "
                f"(gen {self.commit.gen}, {self.commit.n_traj} trajectories) is intact. Fix "
                "the cause (disk space, permissions) and call flush() to retry"
            ) from e

    def flush(self) -> None:
        """Block until everything added so far is committed (and the sampler state saved)."""
        with self._cond:
            self._check_open()
            if self._error is not None:
                err = self._error
                self._error = None  # retry the pending work once
                self._want_gen += 1
                self._cond.notify_all()
                log.info("zreplay: retrying after writer error %r", err)
            self._want_gen += 1
            target = self._want_gen
            self._cond.notify_all()
            while self._done_gen < target:
                self._raise_writer_error()
                if not self._thread.is_alive():
                    raise WriteFailedError(
                        "the writer thread is gone (interpreter shutting down?); the last "
                        f"commit (gen {self.commit.gen}) is intact"
                    )
                self._cond.wait(0.5)

    # -- reading --------------------------------------------------------------------

    def snapshot(self) -> tuple[TrajectoryIndex, int, int]:
        """(index, n_traj, low) consistent at one instant; callers hold no lock after."""
        with self._lock:
            return self.index, self.index.n, self.index.low

    def gather(self, rows: np.ndarray, keys: list[str] | None = None) -> dict[str, np.ndarray]:
        """Rows (global, visible) of each key as ``[len(rows), *row_shape]`` arrays."""
        rows = np.asarray(rows, np.int64)
        return self.draw_and_gather(lambda _index: rows, keys)[1]

    def draw_and_gather(
        self,
        draw: Callable[[TrajectoryIndex], np.ndarray],
        keys: list[str] | None = None,
        alloc: Callable[[str, tuple, np.dtype], np.ndarray] | None = None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Call ``draw(index)`` for global rows under the lock, then gather them.

        Drawing under the same lock that guards eviction means every drawn row is still
        readable when it is read: no sample ever mixes fields of different transitions.
        ``alloc(key, shape, dtype)`` provides each output array (e.g. pinned memory);
        rows are gathered straight into it.
        """
        alloc = alloc or (lambda _key, shape, dtype: np.empty(shape, dtype))
        with self._cond:
            self._check_open()
            rows = np.asarray(draw(self.index), np.int64)
            if self.schema is None:
                return rows, {}
            keys = self.schema.keys if keys is None else keys
            out = {}
            for k in keys:
                spec = self.schema.specs[k]
                out[k] = alloc(k, (len(rows), *spec.row_shape), spec.dtype)
            tier = self.tier
            in_tier = rows >= (tier.lo if tier is not None else self.index.n_rows)
            if in_tier.all():
                slots = rows % tier.capacity
                for k in keys:
                    np.take(tier.rings[k], slots, axis=0, out=out[k], mode="clip")
                return rows, out
            if in_tier.any():
                sel = np.nonzero(in_tier)[0]
                slots = rows[sel] % tier.capacity
                for k in keys:
                    out[k][sel] = tier.rings[k][slots]
            while self._reclaiming:
                self._cond.wait()
            self._disk_readers += 1
        try:
            miss = np.nonzero(~in_tier)[0]
            uniq, inv = np.unique(rows[miss], return_inverse=True)
            futs = {k: self.segment.read_rows(k, uniq) for k in keys}
            for k, f in futs.items():
                if len(miss) == len(rows):
                    np.take(f.result(), inv, axis=0, out=out[k], mode="clip")
                else:
                    out[k][miss] = f.result()[inv]
        finally:
            with self._cond:
                self._disk_readers -= 1
                self._cond.notify_all()
        return rows, out

    def read_trajectory(self, i: int, keys: list[str] | None = None) -> dict[str, np.ndarray]:
        """Trajectory ``i`` as ``[T, B, ...]`` arrays."""
        idx = self.index
        lo, hi = int(idx.offsets[i]), int(idx.offsets[i + 1])
        T, B = int(idx.column("T")[i]), int(idx.column("B")[i])
        flat = self.gather(np.arange(lo, hi), keys)
        return {k: np.swapaxes(v.reshape(B, T, *v.shape[1:]), 0, 1) for k, v in flat.items()}

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
            write_snapshot(self.path, self.writer_id, commit, Path(dest), self.durable)

    def adopt(self, src_root: Path, src_writer: str, first: int, stop: int, sampler: dict) -> None:
        """Replace this segment's contents with trajectories ``[first, stop)`` of a
        zreplay segment, by hard-linking its files (no data copy)."""
        from ..store.snapshot import link_tree

        src = BufferRoot(src_root)
        schema, layouts = src.schema()
        src_dir = src.segment_dir(src_writer)
        src_commit = read_commit(src_dir)
        cols = Segment(src_dir, schema, layouts, writable=False).read_index(src_commit)
        off = cols["offsets"]
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
                with self._cond:
                    self._stop = True
                    self._cond.notify_all()
                self._thread.join()
                self._closed = True
                self._wlock.release()
                if self.temporary:
                    self._finalizer()

    @property
    def closed(self) -> bool:
        return self._closed
