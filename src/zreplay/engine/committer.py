"""The background committer of a writer: published rows become commits.

Adds publish rows to the writer's RAM tier and in-RAM index and ask for a commit
(:meth:`Committer.request`).  This thread asks the writer for the next :class:`Job`
(whole published trajectories, built under the writer's condition), writes their rows,
index entries and saved priorities through the segment, publishes ``commit.json``
atomically, and hands the result back to the writer (``owner.committed``), which alone
changes its state (only then may the RAM tier reuse those rows' slots).  After a commit
that evicted rows it deletes the shards holding only evicted rows, once no in-process
disk read needs them.

The owner is duck-typed (no import of the writer): it offers ``cond`` (its condition),
``commit``, ``segment``, ``layouts``, ``seg_dir``, ``durable``, ``priority_arrays()``,
``next_job(explicit)`` and ``committed(commit, job)`` / ``job_failed(job)`` (called with
``cond`` held).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from ..errors import BufferClosedError, WriteFailedError
from ..store.commit import Commit, write_commit
from ..store.priority import next_copy

log = logging.getLogger("zreplay")

JOB_BYTES = 64 << 20


@dataclass
class Job:
    """What one commit covers and what must be written before it is published."""

    commit: Commit
    complete: bool  # covers everything published when it was built
    rows: tuple[int, int]  # rows [start, stop) to write from the tier
    first_traj: int
    offsets: np.ndarray  # offsets[first_traj : ...]
    columns: dict[str, np.ndarray]  # trajectory columns from first_traj
    first_piece: int
    pieces: dict[str, np.ndarray]  # episode pieces from first_piece
    tier: object
    segment: object
    keys: list[str]
    priorities: tuple[int, int, np.ndarray] | None = None  # (slot, first row, leaves)


class StateSource(Protocol):
    """What a writer saves with every commit beside its rows: the owner's JSON state
    (random stream, sampler) and, for prioritized samplers, the leaves to save."""

    keeps_priorities: bool

    def state(self) -> dict: ...

    def priorities_to_save(self, n_rows: int, explicit: bool) -> tuple[dict, np.ndarray] | None:
        """``(meta, leaves)`` of rows ``[meta["low"], meta["high"])`` to save with the
        commit of ``n_rows`` rows, or None (``explicit``: a flush asked for it)."""

    def save_failed(self) -> None:
        """The commit carrying the last leaves handed out was not published."""


def sampler_state(
    source: StateSource | None, named: dict | None, n_rows: int | None, explicit: bool
) -> tuple[dict, tuple[int, int, np.ndarray] | None]:
    """The sampler state a commit carries and the priorities to write before it is
    published: ``(state, (slot, first row, leaves) or None)``.  ``named``: the priority
    copy the current commit names (carried on when nothing new is saved; a new save goes
    to the other copy).  Priorities are only saved with commits of new rows (``n_rows``
    given)."""
    if source is None:
        return {}, None
    state = dict(source.state())
    if not source.keeps_priorities:
        return state, None
    got = source.priorities_to_save(n_rows, explicit) if n_rows is not None else None
    if got is None:
        if named:
            state["priority"] = named
        return state, None
    meta, leaves = got
    meta["slot"], meta["seq"] = next_copy(named)
    state["priority"] = meta
    return state, (meta["slot"], meta["low"], leaves)


def build_job(
    writer_id: str,
    index,
    old: Commit,
    tier,
    schema,
    segment,
    next_id: int,
    next_episode: int,
    batch_ends: list[int] = (),
) -> Job:
    """What the next commit after ``old`` covers: whole adds (``batch_ends``: the
    trajectory counts at which each add's batch ends; an add is never committed in part)
    published since, at most the store backend's ``commit_tier_share`` of the RAM tier (a
    quarter locally, all of it in an object store) or ``JOB_BYTES`` (but at least one
    add), so adds waiting for room are released progressively and the store's copies of
    the rows being written stay small.  Reads its arguments, changes nothing; the
    commit's ``sampler`` state is the caller's to fill in."""
    first = min(old.n_traj, index.n)
    stop = index.n
    if tier is not None and stop > first:
        share = segment.backend.commit_tier_share if segment is not None else 0.25
        rows = min(int(tier.capacity * share), JOB_BYTES // max(1, schema.row_bytes))
        budget = old.n_rows + max(1, rows)
        stop = max(first + 1, int(np.searchsorted(index.offsets, budget, side="right")) - 1)
        stop = min(stop, index.n)
        ends = [e for e in batch_ends if first < e <= index.n]
        if ends:  # the last whole add within the budget, else the first add
            fit = [e for e in ends if e <= stop]
            stop = fit[-1] if fit else ends[0]
    low = min(index.low, stop)
    columns = index.columns_range(first, stop)
    ends = index.column("piece_end")
    p_first = int(ends[first - 1]) if first else 0
    p_stop = int(ends[stop - 1]) if stop else 0
    p_low = int(ends[low - 1]) if low else 0
    pieces = index.pieces.columns_range(p_first, p_stop)
    if stop < index.n:  # ids of trajectories/episodes this commit does not cover stay unclaimed
        next_id = claimed_id(old.next_trajectory_id, columns["trajectory_id"])
        next_episode = claimed_id(old.next_episode, pieces["episode"])
    new = Commit(
        writer_id=writer_id,
        gen=old.gen + 1,
        n_rows=int(index.offsets[stop]),
        n_traj=stop,
        low_row=int(index.offsets[low]),
        low_traj=low,
        reclaimed_below=old.reclaimed_below,
        next_trajectory_id=next_id,
        n_pieces=p_stop,
        low_piece=p_low,
        next_episode=next_episode,
        writer_number=old.writer_number,
    )
    return Job(
        commit=new,
        complete=stop == index.n,
        rows=(old.n_rows, new.n_rows),
        first_traj=first,
        offsets=index.offsets[first : stop + 1].copy(),
        columns=columns,
        first_piece=p_first,
        pieces=pieces,
        tier=tier,
        segment=segment,
        keys=schema.keys if schema is not None else [],
    )


class Committer:
    def __init__(self, owner):
        self.owner = owner
        self.cond = owner.cond
        self.want = self.done = 0  # commit generations asked for / finished
        self.explicit = 0  # the last generation asked for by flush()
        self.error: BaseException | None = None
        self.reported = False  # the caller has seen self.error
        self.stopping = False
        self._disk_readers = 0
        self._reclaiming = False
        self.thread = threading.Thread(target=self._loop, name="zreplay-writer", daemon=True)
        self.thread.start()

    # -- called by the writer (condition held unless noted) -------------------------

    def request(self) -> None:
        """Ask for a commit of everything published so far."""
        self.want += 1
        self.cond.notify_all()

    def wait_committed(self, row: int) -> None:
        """Block until rows below ``row`` are committed."""
        while self.owner.commit.n_rows < row:
            self.raise_error()
            if self.stopping:
                raise BufferClosedError("buffer is closing")
            self.cond.wait(0.5)

    def raise_error(self) -> None:
        if self.error is not None:
            e, c = self.error, self.owner.commit
            self.reported = True
            raise WriteFailedError(
                f"the background writer failed ({type(e).__name__}: {e}); the last commit "
                f"(gen {c.gen}, {c.n_traj} trajectories) is intact and what was added since "
                "is held in memory, not on disk. Fix the cause (disk space, permissions); "
                "flush() retries the write (and so does the next add)"
            ) from e

    def before_add(self) -> None:
        """An add after a failed commit reports the failure once (that add adds nothing);
        later adds retry the commit, as flush() does (condition not held)."""
        with self.cond:
            if self.error is None:
                return
            if not self.reported:
                self.raise_error()
            self._retry()

    def _retry(self) -> None:
        log.info("zreplay: retrying after writer error %r", self.error)
        self.error = None
        self.request()

    def flush(self) -> None:
        """Block until everything published is committed (condition not held)."""
        with self.cond:
            if self.error is not None:
                self._retry()
            self.request()
            target = self.explicit = self.want
            while self.done < target:
                self.raise_error()
                if not self.thread.is_alive():
                    raise WriteFailedError(
                        "the writer thread is gone (interpreter shutting down?); the last "
                        f"commit (gen {self.owner.commit.gen}) is intact"
                    )
                self.cond.wait(0.5)

    def stop(self) -> None:
        """Let the thread finish (after a flush) and join it (condition not held)."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join()

    def abandon(self) -> None:
        """Stop without committing anything more (the writer's state is stale; condition
        held or not: the thread exits when it next looks)."""
        self.stopping = True
        self.want = self.done
        self.error = None

    def begin_disk_read(self) -> None:
        """A reader is about to read committed rows from disk: hold off shard deletion."""
        while self._reclaiming:
            self.cond.wait()
        self._disk_readers += 1

    def end_disk_read(self) -> None:
        with self.cond:
            self._disk_readers -= 1
            self.cond.notify_all()

    # -- the thread -----------------------------------------------------------------

    def _loop(self) -> None:
        owner = self.owner
        while True:
            with self.cond:
                while (self.done >= self.want or self.error) and not self.stopping:
                    self.cond.wait()
                if self.stopping and (self.done >= self.want or self.error):
                    return
                target = self.want
                job = owner.next_job(self.explicit > self.done)
            try:
                self._write(job)
            except BaseException as e:  # surfaced to the caller by flush()/add()
                log.error("zreplay writer failed: %r", e)
                with self.cond:
                    self.error, self.reported = e, False
                    owner.job_failed(job)
                    self.cond.notify_all()
                continue
            with self.cond:
                owner.committed(job.commit, job)
                self.cond.notify_all()
            # A flush returns once the shards its commit evicted are deleted too (adds no
            # longer wait for every commit, so one commit may evict many trajectories).
            self._reclaim(job.commit)
            if job.complete:
                with self.cond:
                    self.done = target
                    self.cond.notify_all()

    def _write(self, job: Job) -> None:
        new, seg = job.commit, job.segment
        if seg is not None:
            start, stop = job.rows
            seg.ensure_capacity(new.n_rows, new.n_traj, new.n_pieces)
            futs = []
            for key in job.keys if stop > start else ():
                futs += _write_key(seg, job.tier, key, start, new.low_row, stop)
            futs += seg.write_index(
                job.first_traj, job.offsets, job.columns, job.first_piece, job.pieces
            )
            for f in futs:
                f.result()
        if job.priorities is not None:
            slot, low, leaves = job.priorities
            self.owner.priority_arrays().write(slot, low, leaves)
        write_commit(self.owner.seg_dir, new, durable=self.owner.durable)

    def _reclaim(self, commit: Commit) -> None:
        """Delete shards that hold only evicted rows, once no in-process read needs them."""
        owner = self.owner
        seg = owner.segment
        if seg is None or commit.low_row <= commit.reclaimed_below:
            return
        shard = min(lay.shard_rows for lay in owner.layouts.values())
        target = (commit.low_row // shard) * shard
        if target <= commit.reclaimed_below:
            return
        with self.cond:
            if self._disk_readers or owner.commit.gen != commit.gen:
                return  # retried after a later commit
            # Announce first, so readers in other processes can tell their rows are gone.
            announced = replace(commit, reclaimed_below=target, gen=commit.gen + 1)
            try:
                write_commit(owner.seg_dir, announced, durable=owner.durable)
            except OSError as e:
                log.warning("zreplay: could not announce shard reclaim: %r", e)
                return
            owner.committed(announced, None)
            self._reclaiming = True
        try:
            seg.reclaim_below(commit.reclaimed_below, target)
        except OSError as e:
            log.warning("zreplay: could not reclaim evicted shards: %r", e)
        finally:
            with self.cond:
                self._reclaiming = False
                self.cond.notify_all()


def _write_key(seg, tier, key: str, start: int, low: int, stop: int) -> list:
    """Write rows ``[start, stop)`` of ``key`` from the tier, except rows below ``low``
    (evicted before their commit): the tier may have reused their slots, or (once it
    regrew) never held them, and garbage in a stored chunk damages its live rows too
    (TensorStore rejects a bool chunk holding any byte but 0 and 1).  Shards wholly
    below ``low`` are skipped; the evicted rows in the shard of ``low`` are written as
    fill values, so every shard is still written from its first row on (what an object
    store's shard writer needs: it never reads back rows it did not write)."""
    shard = seg.layouts[key].shard_rows
    first = max(start, low // shard * shard)
    futs = []
    if first < low:
        spec = seg.schema.specs[key]
        futs.append(
            seg.write_rows(key, first, np.zeros((low - first, *spec.row_shape), spec.dtype))
        )
    for row0, piece in tier.read_range(key, max(first, low), stop):
        futs.append(seg.write_rows(key, row0, piece))
    return futs


def claimed_id(previous: int, ids: np.ndarray) -> int:
    """The next unused id once ``ids`` are committed after ids below ``previous``."""
    return max(previous, int(ids.max(initial=-1)) + 1)
