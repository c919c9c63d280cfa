"""The background committer of a writer: published rows become commits.

Adds publish rows to the writer's RAM tier and in-RAM index and ask for a commit
(:meth:`Committer.request`).  This thread asks the writer for the next :class:`Job`
(whole published trajectories, built under the writer's condition), writes their rows,
index entries and saved priorities through the segment, publishes ``commit.json``
atomically, and hands the result back to the writer's state
(``owner.state.set_commit``), which alone changes it (only then may the RAM tier reuse
those rows' slots).  After a commit
that evicted rows it deletes the shards holding only evicted rows, once no in-process
disk read needs them.

What the committer needs from its owner (the writer) is :class:`CommitOwner`.

The thread never dies silently: whatever building or writing a commit raises is kept
(``error``) and reported to the next ``flush()`` or add, which retry; a lost lock stops
the writer for good (every later call raises ``WriterLockedError``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from ..errors import BufferClosedError, WriteFailedError, WriterLockedError, ZReplayError
from ..index.coords import GlobalRow
from ..numbers import check_json
from ..store.commit import Commit, new_contents, write_commit
from ..store.priority import next_copy
from ..threads import InterruptSafeCondition

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


class CommitOwner(Protocol):
    """What a :class:`Committer` needs from the writer it commits for."""

    cond: InterruptSafeCondition  # guards the owner's state and the committer's counters
    commit: Commit  # the last commit published
    # Its WriterState: ``segment`` (None before the first rows), ``layouts`` (shard sizes,
    # for reclaiming), and ``set_commit(commit, job)``: ``commit`` is published (called
    # with ``cond`` held); only then may the RAM tier reuse the rows it covers.
    state: Any
    # Its WriterLock: ``fenced()``, a block of writes only the lock's holder may make (no
    # takeover lands in it); ``check_held()``, WriterLockedError once another writer took
    # it over.
    lock: Any
    seg_dir: Any  # where commit.json is published
    durable: bool  # fsync what a commit names before publishing it
    source: StateSource | None  # what it saves beside the rows, if still alive

    def priority_arrays(self) -> Any:
        """The segment's priority copies (``write(slot, low, leaves)``)."""

    def next_job(self, explicit: bool) -> Job:
        """The next commit to write (``explicit``: a flush asked for it)."""

    def give_up(self, why: str, error: type[Exception]) -> None:
        """Stop for good, later calls raising ``error(why)`` (the lock was taken over)."""


class StateSource(Protocol):
    """What a writer saves with every commit beside its rows: the owner's JSON state
    (random stream, sampler) and, for prioritized samplers, the leaves to save.  The
    writer hands it what it needs (the row space, with the writer's lock held), so it
    never calls back into the writer or its owner."""

    keeps_priorities: bool

    def state(self) -> dict: ...

    def priorities_to_save(
        self, space: Any, n_rows: int, explicit: bool
    ) -> tuple[dict, np.ndarray] | None:
        """``(meta, leaves)`` of rows ``[meta["low"], meta["high"])`` to save with the
        commit of ``n_rows`` rows, or None (``explicit``: a flush asked for it);
        ``space``: the writer's visible rows now (a ``RowSpace``)."""

    def save_failed(self) -> None:
        """The commit carrying the last leaves handed out was not published."""

    def state_failed(self, error: TypeError) -> None:
        """Its state could not be saved (JSON cannot hold it); the commit carried the
        last state saved instead."""


def sampler_state(
    source: StateSource | None,
    named: dict | None,
    n_rows: int | None,
    explicit: bool,
    previous: dict | None = None,
    space: Callable[[], Any] | None = None,
) -> tuple[dict, tuple[int, int, np.ndarray] | None]:
    """The sampler state a commit carries and the priorities to write before it is
    published: ``(state, (slot, first row, leaves) or None)``.  ``named``: the priority
    copy the current commit names (carried on when nothing new is saved; a new save goes
    to the other copy).  Priorities are only saved with commits of new rows (``n_rows``
    given).  A state JSON cannot hold (a sampler attribute set to a numpy scalar after
    it was bound) never holds the rows back: the commit carries ``previous`` (the last
    commit's state) instead, and the source hears why (``state_failed``).  ``space()``:
    the writer's row space (needed when priorities are saved)."""
    if source is None:
        return {}, None
    state = dict(source.state())
    try:
        check_json(state, "the sampler state")
    except TypeError as e:
        source.state_failed(e)
        return dict(previous or {}), None
    if not source.keeps_priorities:
        return state, None
    got = None
    if n_rows is not None and space is not None:
        got = source.priorities_to_save(space(), n_rows, explicit)
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
        contents=old.contents or new_contents(),
        inserted=old.inserted + int(index.offsets[stop]) - old.n_rows,
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
    def __init__(self, owner: CommitOwner):
        self.owner = owner
        self.cond = owner.cond
        self.want = self.done = 0  # commit generations asked for / finished
        self.explicit = 0  # the last generation asked for by flush()
        self.error: BaseException | None = None
        self.reported = False  # the caller has seen self.error
        self.stopping = False
        self.dead: BaseException | None = None  # what stopped the thread, if not stop()
        self.gone: Exception | None = None  # why the writer gave up (abandon)
        self._disk_readers = 0
        self._quiescing = 0
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
            if self.gone is not None:
                raise self.gone
            if self.stopping:
                raise BufferClosedError("buffer is closing")
            self.check_alive()  # a dead thread never commits: say so instead of waiting
            self.cond.wait(0.5)

    def raise_error(self) -> None:
        e = self.error
        if e is None:
            return
        c = self.owner.commit
        self.reported = True
        kept = (
            f"the last commit (gen {c.gen}, {c.n_traj} trajectories) is intact and what was "
            "added since is held in memory, not on disk"
        )
        if isinstance(e, ZReplayError) and not isinstance(e, WriteFailedError):
            # zreplay's own finding (damage, a lost lock): same class, what to do in it.
            raise type(e)(f"the background writer could not commit: {e}; {kept}") from e
        cause = "disk space, permissions" if _io_error(e) else "see the error above"
        raise WriteFailedError(
            f"the background writer failed ({type(e).__name__}: {e}); {kept}. Fix the cause "
            f"({cause}); flush() retries the write (and so does the next add)"
        ) from e

    def check_alive(self) -> None:
        """``WriteFailedError`` if the thread is gone although nobody stopped it (it
        never should be: see the module docstring)."""
        if not self.thread.is_alive() and not self.stopping:
            c = self.owner.commit
            raise WriteFailedError(
                f"the writer thread is gone ({self.dead!r}; interpreter shutting down?); the "
                f"last commit (gen {c.gen}) is intact, nothing added since can be committed: "
                "reopen the buffer"
            )

    def before_add(self) -> None:
        """An add after a failed commit reports the failure once (that add adds nothing);
        later adds retry the commit, as flush() does (condition not held)."""
        with self.cond:
            self.check_alive()
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
                if self.gone is not None:
                    raise self.gone
                if not self.thread.is_alive():
                    self.check_alive()
                    raise BufferClosedError("the buffer was closed while flush() waited")
                self.cond.wait(0.5)

    def stop(self) -> None:
        """Let the thread finish (after a flush) and join it (condition not held).

        It waits on the condition, never in a bare ``join``: should the caller's thread
        still hold the condition's lock (a ``threading.Condition`` leaks it to a Ctrl-C,
        CPython issue 29988; ``InterruptSafeCondition`` does not, but a hold left any
        other way would do the same), only a wait on the condition releases it so the
        thread can finish."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
            while self.thread.is_alive():
                self.cond.wait(0.05)
        self.thread.join()

    def abandon(self, why: Exception | None = None) -> None:
        """Stop without committing anything more (the writer's state is stale; condition
        held or not: the thread exits when it next looks); ``why`` is raised by flushes
        waiting for it."""
        self.stopping = True
        self.want = self.done
        self.error = None
        self.gone = why

    def begin_disk_read(self) -> bool:
        """A reader is about to read committed rows from disk (condition held): hold off
        shard deletion.  False if the reader's snapshot went stale while it waited (a
        clear or replace ran: draw again on a new snapshot)."""
        stale = False
        while self._reclaiming or self._quiescing:
            stale = stale or bool(self._quiescing)
            self.cond.wait()
        if stale:
            return False
        self._disk_readers += 1
        return True

    @contextlib.contextmanager
    def quiescent(self) -> Iterator[None]:
        """With the condition held: wait until no in-process read of committed rows from
        disk is in flight, and keep new ones from starting in the block (the files they
        read are about to be removed or moved: a clear, a replace); readers that had
        their snapshot before draw again (``begin_disk_read``)."""
        self._quiescing += 1
        try:
            while self._disk_readers:
                self.cond.wait()
            yield
        finally:
            self._quiescing -= 1
            self.cond.notify_all()

    def end_disk_read(self) -> None:
        with self.cond:
            self._disk_readers -= 1
            self.cond.notify_all()

    # -- the thread -----------------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._serve()
        except BaseException as e:  # noqa: BLE001 - kept for check_alive(), never silent
            log.exception("zreplay: the writer thread stopped")
            with self.cond:
                self.dead = e
                self.cond.notify_all()

    def _serve(self) -> None:
        owner = self.owner
        while True:
            with self.cond:
                while (self.done >= self.want or self.error) and not self.stopping:
                    self.cond.wait()
                if self.stopping and (self.done >= self.want or self.error):
                    return
                target = self.want
                try:
                    job = owner.next_job(self.explicit > self.done)
                except BaseException as e:  # noqa: BLE001 - surfaced by flush()/add()
                    self._failed(e, None)
                    continue
            try:
                self._write(job)
            except BaseException as e:  # noqa: BLE001 - surfaced by flush()/add()
                with self.cond:
                    self._failed(e, job)
                continue
            with self.cond:
                owner.state.set_commit(job.commit, job)
                self.cond.notify_all()
            # A flush returns once the shards its commit evicted are deleted too (adds no
            # longer wait for every commit, so one commit may evict many trajectories).
            try:
                self._reclaim(job.commit)
            except Exception as e:  # noqa: BLE001 - shards are deleted by a later commit
                log.warning("zreplay: could not reclaim evicted shards: %r", e)
            if job.complete:
                with self.cond:
                    self.done = target
                    self.cond.notify_all()

    def _failed(self, e: BaseException, job: Job | None) -> None:
        """A commit failed (condition held): keep the error for the caller."""
        log.error("zreplay writer failed: %r", e)
        self.error, self.reported = e, False
        source = self.owner.source
        if job is not None and job.priorities is not None and source is not None:
            source.save_failed()  # the leaves it handed over were not saved
        if isinstance(e, WriterLockedError):  # another writer took the segment over
            self.owner.give_up(str(e), WriterLockedError)
        self.cond.notify_all()

    def _write(self, job: Job) -> None:
        # A writer whose lock was taken over writes nothing: the whole commit is fenced
        # (checked first; locally no takeover can land in it), and checked again before
        # the record is published (the rows of a commit never published are garbage).
        with self.owner.lock.fenced():
            self._write_fenced(job)

    def _write_fenced(self, job: Job) -> None:
        new, seg = job.commit, job.segment
        if seg is not None:
            start, stop = job.rows
            seg.set_lengths(new.n_rows, new.n_traj, new.n_pieces)
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
        self.owner.lock.check_held()
        write_commit(self.owner.seg_dir, new, durable=self.owner.durable)
        if seg is not None:
            try:  # for plain-zarr readers; the commit is published whatever happens here
                seg.publish_live_rows(new.low_row, new.n_rows, self.owner.durable)
            except OSError as e:
                log.warning("zreplay: could not update the segment's live_rows: %r", e)

    def _reclaim(self, commit: Commit) -> None:
        """Delete shards that hold only evicted rows, once no in-process read needs them."""
        owner = self.owner
        seg = owner.state.segment
        if seg is None or commit.low_row <= commit.reclaimed_below:
            return
        shard = min(lay.shard_rows for lay in owner.state.layouts.values())
        target = (commit.low_row // shard) * shard
        if target <= commit.reclaimed_below:
            return
        with self.cond:
            if self._disk_readers or owner.commit.gen != commit.gen:
                return  # retried after a later commit
            # Announce first, so readers in other processes can tell their rows are gone.
            announced = replace(commit, reclaimed_below=target, gen=commit.gen + 1)
            try:
                with owner.lock.fenced():
                    write_commit(owner.seg_dir, announced, durable=owner.durable)
            except OSError as e:
                log.warning("zreplay: could not announce shard reclaim: %r", e)
                return
            owner.state.set_commit(announced, None)
            self._reclaiming = True
        try:
            seg.reclaim_below(commit.reclaimed_below, target)
        except OSError as e:
            log.warning("zreplay: could not reclaim evicted shards: %r", e)
        finally:
            with self.cond:
                self._reclaiming = False
                self.cond.notify_all()


def _write_key(seg, tier, key: str, start: GlobalRow, low: GlobalRow, stop: GlobalRow) -> list:
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


def _io_error(e: BaseException) -> bool:
    """Whether ``e`` looks like a failed read or write of the store (an ``OSError``, or
    TensorStore's error naming a file operation)."""
    if isinstance(e, OSError):
        return True
    text = str(e).lower()
    return any(w in text for w in ("error writing", "error reading", "no space", "permission"))
