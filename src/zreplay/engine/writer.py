"""The writer of one segment: its in-RAM index, the RAM tier and the background committer.

Life of a trajectory:

1. ``add`` (caller's thread): rows are reserved, copied env-major into the RAM tier and
   published to the in-RAM index, so in-process sampling sees them at once.
2. The committer thread writes published rows and index entries, then atomically
   replaces ``commit.json`` and hands the commit back.  Only then may the ring reuse
   those rows' slots: adds wait once uncommitted rows fill the RAM tier plus
   ``staging_bytes`` (backpressure instead of data loss).
3. ``read`` lets a draw see a consistent :class:`~zreplay.engine.gather.Snapshot` under
   the lock (so a concurrent ``add`` can never tear a row or evict a drawn one) and
   gathers it: RAM-tier rows under the lock, the rest from disk, shard deletion held off.

Replacing a segment's contents (loading a checkpoint) is in :mod:`zreplay.engine.replace`;
the buffer core (:mod:`zreplay.core`) sits on top of this class.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path

from ..errors import BufferClosedError, EmptyBufferError, WriteFailedError, WriterLockedError
from ..forks import Origin
from ..numbers import as_int, check_json
from ..schema import Schema, check_key_component
from ..store.checkpoint import write_snapshot
from ..store.commit import Commit
from ..store.guard import TreeWatch, check_target
from ..store.layout import check_recorded
from ..store.location import locate
from ..store.lock import WriterLock
from ..store.priority import PriorityArrays, saved_priorities
from ..store.root import BufferRoot
from ..threads import InterruptSafeCondition, deferred_interrupts
from .committer import Committer, Job, StateSource
from .gather import Snapshot, as_requests, gather_begin, gather_finish
from .preload import TierPreload
from .prepared import Prepared, check_batch
from .ramtier import RamPolicy
from .recovery import fix_schema, open_segment, remove_for_overwrite
from .replace import clear as clear_segment
from .sealed import SealedLayout, open_sealed, sealed_moved
from .state import WriterState

log = logging.getLogger("zreplay")

_LIVE: weakref.WeakSet = weakref.WeakSet()
READ_RETRIES = 5


@atexit.register
def _close_live_writers() -> None:
    # Daemon writer threads still run during atexit, so unclosed buffers commit what was
    # added instead of losing it (and never hang in a __del__ during finalization).
    for w in list(_LIVE):
        try:
            w.close()  # a forked child's copies: closed without touching anything
        except Exception as e:  # noqa: BLE001 - best effort at exit
            log.error("zreplay: closing %s at exit failed: %r", w.path, e)


def _remove_store(path: str, owner: Origin) -> None:
    if not owner.inherited:
        shutil.rmtree(path, ignore_errors=True)


class SegmentWriter:
    """A writable buffer segment with in-process readers. Thread-safe.

    Its :class:`~zreplay.engine.state.WriterState` (``state``: commit, index, ids, RAM
    tier) changes only under ``cond``, through the state's methods, called from here and
    from the committer's hand-offs (``next_job``, ``state.set_commit``).  Adds are
    serialised by a second lock; the copy into the RAM tier runs outside ``cond`` so
    sampling goes on.  ``lock`` is the segment's
    :class:`~zreplay.store.lock.WriterLock`: the committer and a replacement fence their
    writes with it.
    """

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
        storage_options: Mapping | None = None,
        staging_bytes: int | None = None,
    ):
        check_key_component(writer_id, "segments")  # before anything is made or removed
        if capacity is not None:
            capacity = as_int(capacity, "capacity (rows)", minimum=1)
        if staging_bytes is not None:
            staging_bytes = as_int(staging_bytes, "staging_bytes", minimum=0)
        # A forked child's copy never writes (_check_process) nor removes anything.
        self._origin = Origin()
        self.temporary = path is None
        if self.temporary:
            path = tempfile.mkdtemp(prefix="zreplay-")
            # Removed on close(), or at interpreter exit if the owner never closed it (by
            # this process only: a forked child exiting must not remove its parent's).
            self._finalizer = weakref.finalize(self, _remove_store, path, self._origin)
        self.root = BufferRoot(path, storage_options)
        self.path = self.root.path
        self.writer_id = writer_id
        self.ram = ram or RamPolicy()
        self.durable, self._layout_overrides = durable, dict(layout or {})
        self._source: Callable[[], StateSource | None] = lambda: None
        self._priorities: PriorityArrays | None = None

        self.cond = InterruptSafeCondition()
        self._add_lock = threading.Lock()
        self._closed = False
        self._abandoned: str | None = None  # why give_up stopped this writer
        self._abandoned_as: type[Exception] = BufferClosedError

        if overwrite and self.path.exists() and not self.temporary:
            remove_for_overwrite(self.path)
        # An import or checkpoint replacing the whole buffer meanwhile (store/guard.py):
        # what failed or was read here may be half of each tree, so it is refused as
        # the race it is (WriterLockedError), never reported as damage.
        watch = TreeWatch(self.path)
        try:
            # The buffer's sealed segments, which it samples beside its own: damage to
            # one is refused before this writer makes or changes anything.
            sealed = open_sealed(self.root, writer_id, self.ram.column_budget)
            # Before making anything: a writer refused now leaves nothing in either tree.
            watch.check(break_lock=break_lock)
            self.root.create()
            made = watch.stamp is None  # (no buffer yet: its sealed segments read below)
            watch.restamp()
            self.seg_dir = self.root.segment_dir(writer_id)
            self.seg_dir.mkdir(parents=True, exist_ok=True)
            self.root.create_meta_node(self.seg_dir)
        except WriterLockedError:
            raise  # (the look above: judged once)
        except Exception:
            watch.check(break_lock=break_lock)
            raise
        # The segment's writer lock: the committer fences its writes with it.
        self.lock = WriterLock(self.seg_dir)
        self._committer = self._preload = None
        try:  # from taking the lock on: a Ctrl-C anywhere leaves nothing held
            try:
                self.lock.acquire(break_lock=break_lock)
            except Exception:
                watch.check(break_lock=break_lock)  # the replacement holds this lock, or moved it
                raise
            # From here on no replacement starts (it would find this lock held), so
            # what is read next is of one tree: the one checked now.
            watch.check(self.lock, break_lock)
            if watch.stamp is None:  # no file stamps here (object stores): compare reads
                stale = not sealed or sealed_moved(sealed)
            else:
                stale = made  # read before there was a buffer: one may have been put there
            if stale:
                sealed = open_sealed(self.root, writer_id, self.ram.column_budget)
            opened = open_segment(self.root, writer_id, durable)
            if opened.schema is not None:
                check_recorded(opened.schema.specs, opened.layouts, self._layout_overrides)
            self.state = WriterState(writer_id, opened, self.ram, capacity, staging_bytes)
            if sealed:
                self.state.sealed = SealedLayout(writer_id, sealed)
            # Reopened with a smaller capacity: rows beyond it leave at once (committed
            # with the first commit), not with the next add.
            over = capacity is not None and self.state.index.visible_rows > capacity
            if over:
                self.state.index.evict_to(capacity)
            with deferred_interrupts():  # no thread started that nothing would stop
                self._committer = Committer(self)
                self._preload = TierPreload(self.cond, self.state, self._committer).start()
            _LIVE.add(self)
            if over:
                with self.cond:
                    self._committer.request()
        except BaseException:
            self._abort_open()
            raise

    def _abort_open(self) -> None:
        """Undo a constructor that failed (or was interrupted) part way: its threads
        stopped, its lock released, nothing left for a new writer to wait for."""
        with deferred_interrupts():
            self._closed = True
            _LIVE.discard(self)
            try:
                if self._preload is not None:
                    self._preload.stop()
                if self._committer is not None:
                    self._committer.abandon(BufferClosedError("the open was interrupted"))
                    self._committer.stop()
            finally:
                self.lock.release()

    def attach(self, source: StateSource) -> None:
        """Save ``source``'s state with every commit from now on.  Held weakly: its
        sampler may be a hook that holds the facade, which the committer thread must not
        keep alive (dropping the facade closes this writer)."""
        self._source = weakref.ref(source)

    # Read-only views of the state, for the core (the committer reads ``state``).
    @property
    def schema(self) -> Schema | None:
        return self.state.schema

    @property
    def commit(self) -> Commit:
        return self.state.commit

    writable = True

    @property
    def num_rows(self) -> int:
        """Visible rows: this segment's and those of the sealed segments it samples."""
        sealed = self.state.sealed
        return self.state.index.visible_rows + (sealed.rows if sealed else 0)

    @property
    def own_rows(self) -> int:
        """This segment's visible rows (what its capacity counts)."""
        return self.state.index.visible_rows

    @property
    def num_trajectories(self) -> int:
        sealed = self.state.sealed
        return self.state.index.num_visible + (sealed.trajectories if sealed else 0)

    @property
    def next_trajectory_id(self) -> int:
        return self.state.next_trajectory_id

    def episodes(self):
        if self.state.sealed is not None:
            return self.locked(lambda snap: snap.episodes)
        return self.state.index.episodes()

    def empty_message(self) -> str:
        return "Cannot sample from an empty buffer."

    def refresh(self) -> bool:
        """A writer reads its live state: there is nothing to pick up (False)."""
        return False

    def stale(self) -> bool:
        """A writer's state is never behind its commits (False)."""
        return False

    # -- adding ---------------------------------------------------------------------

    def add(self, items: list[Prepared]) -> list[int]:
        """Validate, then append trajectories; returns their trajectory ids.

        All or nothing: nothing is written unless every item passes validation, and an
        exception while they are copied (a bad array, KeyboardInterrupt) gives their RAM
        rows back and publishes none of them.
        """
        if not items:
            return []
        self._check_process()
        with self._add_lock:
            self._check_open()
            st = self.state
            lanes_b = None if st.lanes is None else len(st.lanes.episode)
            schema = check_batch(items, st.schema, lanes_b, st.capacity)
            self._committer.before_add()
            if st.schema is None or st.segment is None:  # (no arrays: a clear failed late)
                self._fix_schema(schema, items[0].n_rows)
            elif st.tier is None:
                with self.cond:
                    st.make_tier(items[0].n_rows)
            return self._add_batch(items)

    def validate(self, items: list[Prepared]) -> None:
        """The checks :meth:`add` makes before anything is written (a ``ValueError``
        subclass on the first problem), made now: keys, dtypes, shapes, sizes."""
        st = self.state
        lanes_b = None if st.lanes is None else len(st.lanes.episode)
        check_batch(items, st.schema, lanes_b, st.capacity)

    def _fix_schema(self, schema: Schema, first_rows: int) -> None:
        layouts, segment = fix_schema(
            self.root, self.seg_dir, schema, self._layout_overrides, self.durable
        )
        with self.cond:
            self.state.set_schema(schema, layouts, segment)
            self.state.make_tier(first_rows)

    def _add_batch(self, items: list[Prepared]) -> list[int]:
        st, total = self.state, sum(it.n_rows for it in items)
        tier, start, published = None, None, False
        try:
            with self.cond:
                rows = st.tier_too_small(items)
                if rows is not None:
                    self._committer.wait_committed(st.tier.hi)
                    st.regrow_tier(items, rows)
                while True:
                    tier = st.staging_room(total)
                    # Rows about to be overwritten must be on disk first (backpressure).
                    need = tier.hi + total - tier.capacity
                    if need <= st.commit.n_rows:
                        break
                    # The wait lets the committer run, and a commit may give a grown ring
                    # back (WriterState._give_back): take the ring afresh after it.
                    self._committer.wait_committed(need)
                with deferred_interrupts():
                    start = tier.reserve(total, st.commit.n_rows)
            row = start
            for it in items:
                tier.write_trajectory(row, it.columns, it.T, it.B)
                row += it.n_rows
            with self.cond, deferred_interrupts():
                ids = st.publish(items, start)
                published = True
                self._committer.request()
            return ids
        finally:
            if start is not None and not published:
                with self.cond, deferred_interrupts():
                    tier.unreserve(start)

    def reserve_trajectory_ids(self, stop: int) -> None:
        """Never hand out trajectory ids below ``stop`` (ids an imported buffer used)."""
        with self.cond:
            self.state.reserve_trajectory_ids(stop)

    def flush(self) -> None:
        """Block until everything added so far is committed (and the sampler state saved)."""
        self._check_process()
        with self.cond:
            self._check_open()
        self._committer.flush()

    # -- the committer's hand-offs (condition held) -----------------------------------

    def next_job(self, explicit: bool) -> Job:
        return self.state.next_job(self._source(), explicit, lambda: self.snapshot().space)

    def priority_arrays(self) -> PriorityArrays:
        if self._priorities is None:
            self._priorities = PriorityArrays(self.seg_dir, writable=True, durable=self.durable)
        return self._priorities

    def saved_priorities(self):
        """The priorities the current commit names (for a sampler that starts afresh)."""
        return saved_priorities(self.seg_dir, self.state.commit, self.priority_arrays())

    # -- reading --------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The visible rows at this instant (call with ``cond`` held)."""
        return self.state.snapshot(self.saved_priorities)

    def read(
        self, draw: Callable[[Snapshot], object], alloc=None, redraw: bool = True
    ) -> tuple[object, dict]:
        """Call ``draw(snapshot)`` under the lock, then gather what it asks for: positions
        (``[0, num_rows)``; every key is gathered at them) or requests ``{name: (key, positions
        of any shape)}`` (see :mod:`zreplay.engine.gather`).  Drawing under the lock that
        guards eviction means every drawn row is still readable when it is read: no sample
        ever mixes fields of different transitions.  ``alloc(name, shape, dtype)`` provides
        each output (e.g. pinned memory); rows are gathered straight into it.  A writer
        reads its current state, not a snapshot a caller holds: ``redraw`` (a reader's)
        changes nothing here."""
        for _ in range(READ_RETRIES):
            with self.cond:
                self._check_open()
                snap = self.state.snapshot(self.saved_priorities)
                drawn = draw(snap)
                if snap.schema is None:
                    return drawn, {}
                pending = gather_begin(snap, as_requests(drawn, snap.schema), alloc)
                if not pending.reads:
                    return drawn, pending.finish_outputs()
                if not self._committer.begin_disk_read():
                    continue  # cleared or replaced while it waited: draw again
            try:
                return drawn, gather_finish(pending)
            finally:
                self._committer.end_disk_read()
        raise EmptyBufferError("the buffer kept being cleared or replaced while read; sample again")

    def locked(self, fn: Callable[[Snapshot], object]) -> object:
        """``fn(snapshot)`` under the lock: nothing is added or evicted while it runs."""
        with self.cond:
            self._check_open()
            return fn(self.snapshot())

    def stats(self) -> dict:
        """See :meth:`WriterState.stats`; plus the buffer's ``path``."""
        with self.cond:
            return {**self.state.stats(), "path": None if self.temporary else str(self.path)}

    # -- lifecycle ------------------------------------------------------------------

    def _check_process(self) -> None:
        """``WriteFailedError`` in a process forked from the writer's: its lock, threads
        and uncommitted rows stay with the parent (before any lock is taken: one held by
        another thread at the fork is held for good in the child)."""
        if self._origin.inherited:
            raise WriteFailedError(
                f"this buffer's writer belongs to process {self._origin.pid}, and this process was "
                f"forked from it: a forked child cannot write through it (its background "
                "writer did not come along). Open a buffer with another writer_id here, or "
                "read with zreplay.open()"
            )

    def _check_open(self) -> None:
        if self._closed:
            if self._abandoned and self._abandoned_as is not BufferClosedError:
                raise self._abandoned_as(self._abandoned)
            why = f"stopped after an error ({self._abandoned})" if self._abandoned else "closed"
            raise BufferClosedError(
                f"this buffer was {why}; what was committed is safe: make the buffer "
                "again on the same path (or zreplay.open(path) to read it) to go on"
            )

    def clear(self) -> None:
        """Remove every trajectory of this segment, on disk too (see :func:`.replace.clear`)."""
        clear_segment(self)

    def checkpoint(self, dest) -> None:
        """Write a complete, consistent copy-free snapshot of this segment to ``dest``
        (a bad ``dest`` is refused before pending adds are committed)."""
        dest = locate(dest, self.path.backend.storage_options)
        check_target(dest, "save_checkpoint", sources=[self.path])
        with self._add_lock:
            self.flush()
            with self.cond:
                source = self._source()
                if source is not None:  # a checkpoint with a stale state is refused
                    check_json(source.state(), "the sampler state")
                state, _ = self.state.sampler_state(source)
                commit = replace(self.state.commit, sampler=state)
            write_snapshot(self.path, self.writer_id, commit, dest, self.durable)

    # -- for replacing the contents (engine/replace.py) ------------------------------

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """No add runs in the block, and everything added before it is committed."""
        with self._add_lock:
            self.flush()
            with self._preload.paused(lambda: not self._closed):
                yield

    def quiescent(self):
        """With ``cond`` held: a block in which no in-process disk read is in flight or
        starts (files reads may use are removed or moved in it); see
        :meth:`Committer.quiescent`."""
        return self._committer.quiescent()

    @property
    def layout_overrides(self) -> dict:
        return dict(self._layout_overrides)

    @property
    def source(self) -> StateSource | None:
        """What the writer saves with its commits (its owner's state), if still alive."""
        return self._source()

    def reopen(self) -> None:
        """Read the segment afresh from its commit (after its files were replaced; with
        ``cond`` held, inside :meth:`exclusive`); rows past a ``capacity`` are evicted."""
        self._priorities = None
        self.state.reopen(open_segment(self.root, self.writer_id, self.durable))
        self._evict_past_capacity()  # a rank's block may not fit a small buffer

    def set_capacity(self, capacity: int) -> None:
        """Keep at most ``capacity`` rows from now on (``capacity`` given when the
        writer's owner learns it only from its first rows); whole oldest trajectories
        past it leave with the next commit."""
        capacity = as_int(capacity, "capacity (rows)", minimum=1)
        with self.cond:
            self._check_open()
            self.state.capacity = capacity
            self._evict_past_capacity()

    def _evict_past_capacity(self) -> None:
        """With ``cond`` held: whole oldest trajectories past ``capacity`` leave, with a
        commit asked for."""
        st = self.state
        if st.capacity is not None and st.index.visible_rows > st.capacity:
            st.index.evict_to(st.capacity)
            self._committer.request()

    def give_up(self, why: str, error: type[Exception] = BufferClosedError) -> None:
        """Stop this writer for good (it must never commit its stale state) and unlock,
        so that reopening the buffer finishes a change that failed (:mod:`.replace`);
        later calls raise ``error`` saying ``why``."""
        self._committer.abandon(error(why))
        self._closed, self._abandoned, self._abandoned_as = True, why, error
        self.lock.release()

    def drop_ram(self) -> None:
        """Release the RAM tier's committed rows (they stay readable from disk)."""
        with self._add_lock:  # no add may be copying into the tier we replace
            self.flush()
            self._preload.stop()
            with self.cond:
                self.state.empty_tier()

    def close(self) -> None:
        """Commit everything added, save the sampler state, stop the writer, unlock.  In
        a process forked from the writer's (whose copy of the buffer is dropped or closed
        there) nothing is touched: the segment, its lock and its threads are the
        parent's, which goes on."""
        if self._origin.inherited:
            self._closed = True
            return
        with self._add_lock:  # an add in flight finishes (and is committed) first
            if self._closed:
                return
            try:
                self.flush()
            finally:
                # Whatever arrives meanwhile (a Ctrl-C in the threads' joins), every step
                # runs: an interrupted one would leave the lock held and renewed for a
                # segment its caller then removes (an import's staging tree).  A Ctrl-C
                # here is raised once the lock is released.
                with deferred_interrupts():
                    self._preload.stop()
                    self._committer.stop()
                    self._closed = True
                    self.lock.release()
                    if self.temporary:
                        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._closed

    def closing_soon(self) -> None:
        """It is about to be closed on another thread (its buffer was dropped): a new
        writer of its segment in this process waits for the lock to be released."""
        if not self._origin.inherited and not self._closed:
            self.lock.releasing()
