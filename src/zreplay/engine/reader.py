"""The read-only reader of a whole buffer: the union of every writer's committed segment.

A reader takes no lock: writers may keep appending in other processes; :meth:`refresh`
re-reads every segment's commit and picks up what they committed since.  Positions run
over the visible rows (and trajectories) of the segments in name order.  A reader is a
snapshot until :meth:`refresh`: a random draw that meets rows a writer evicted and
deleted meanwhile is drawn again on a refreshed snapshot (the whole reader refreshes),
but positions the caller chose are never re-resolved against another snapshot: their
reads raise :class:`~zreplay.errors.StaleViewError` instead.

Each segment keeps its small keys decoded in a column cache (up to ``column_cache_bytes``
per segment, in a local file every process reading the segment shares;
:mod:`zreplay.engine.colcache`), filled by the first read that needs it and extended by
later ones after a refresh; its large keys (images) likewise in a second one of their own
(up to ``chunk_cache_bytes``): clips of images are then one fancy index per key into
mapped memory, as a memory map of raw pixels is, not a decode of every frame.

A reader handed to another process (DataLoader workers) reopens the store there instead
of using handles (and TensorStore threads) inherited from its parent.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ..errors import CorruptBufferError, EmptyBufferError, FormatError, StaleViewError
from ..forks import Origin
from ..index.coords import positions_of
from ..index.episodes import EpisodeView, concat_pieces
from ..index.rowspace import RowSpace, VisibleRows
from ..index.trajectories import TrajectoryIndex
from ..store.commit import Commit, commit_stamp, read_commit, same_contents, view_low_traj
from ..store.priority import saved_priorities
from ..store.root import BufferRoot
from ..store.segment import Segment
from .colcache import ColumnCache, contents_ident, default_budget, large_keys, small_keys
from .gather import Evicted, Part, Snapshot, as_requests, gather, gather_begin, gather_finish

RETRIES = 5


# How a view and a writer of another segment (which samples the sealed ones, see
# engine/sealed.py) take a segment of the buffer: the same commit checks, the same
# index checks, the same error.


def shown_commit(root: BufferRoot, writer_id: str) -> Commit | None:
    """Segment ``writer_id``'s commit as every reader of the buffer takes it: None
    before its first commit (a writer just joining; an import builds its buffer aside,
    so a sealed segment never appears half made).  A record that cannot be read is a
    :func:`segment_damaged` error: it may be the sealed offline part, which no sample
    may quietly lose."""
    try:
        return read_commit(root.segment_dir(writer_id))
    except CorruptBufferError as e:
        raise segment_damaged(root, writer_id, e, None) from None


def reads_index(commit: Commit) -> bool:
    """Whether a reader reads (and so checks) the segment's index under ``commit``:
    when it shows rows, and for a sealed segment whenever it holds trajectories.  A
    sealed segment never changes, so its index always agrees with its commit: a commit
    that says it shows nothing (a crafted ``low_row``) is caught, not read as empty."""
    return commit.n_rows > commit.low_row or (commit.sealed and commit.n_traj > 0)


def segment_damaged(
    root: BufferRoot, writer_id: str, e: CorruptBufferError, commit: Commit | None
) -> CorruptBufferError:
    """``e`` (damage found in segment ``writer_id``) worded for a reader of the buffer:
    which segment, whether it is sealed, and what to do."""
    if commit is None:  # its record could not be read
        what = "perhaps the buffer's sealed offline part: its record cannot tell"
    else:
        what = "the buffer's sealed offline part" if commit.sealed else "not sealed"
    return CorruptBufferError(
        f"segment {writer_id!r} of {root.path} ({what}) is damaged: {e.finding}",
        f"Run `zreplay verify {root.path}` (zreplay.verify() in Python); then restore the "
        "segment from a checkpoint, "
        f"re-import its dataset, or remove {root.segment_dir(writer_id)} to go on without it",
    )


class _MovedOn(Exception):
    """What a refresh read was replaced meanwhile (a clear, a loaded checkpoint, the
    buffer started afresh): read again."""


class _CommitView:
    """What a reader holds of one segment as of its last refresh: its commit, the index
    read under it, the rows' epoch and the segment's column caches (``cache`` of its small
    keys, ``large`` of the others, with budgets ``budgets``)."""

    def __init__(
        self,
        segment: Segment,
        commit: Commit,
        index: TrajectoryIndex,
        budgets: tuple[int, int],
        before=None,
    ):
        self.segment, self.commit, self.index = segment, commit, index
        # The commit record's stamp taken before ``commit`` was read (set by every
        # refresh): while the record still has it, ``commit`` is the newest.
        self.stamp: object = None
        self.cache_id = contents_ident(segment.dir, commit.contents)
        # Same rows as the state it follows (a sampler keeps what it knows of them, the
        # column cache its rows), or rows renumbered from scratch (the writer cleared or
        # replaced its segment).
        if before is not None and _continues(before, self):
            self.epoch, self.cache, self.large = before.epoch, before.cache, before.large
        else:
            self.epoch = object()
            small, large = budgets
            schema = segment.schema
            self.cache = ColumnCache(schema, small) if small > 0 else None
            keys = large_keys(schema)
            self.large = ColumnCache(schema, large, keys=keys) if large > 0 and keys else None
            if before is not None:
                before.discard_caches()  # those rows are gone for every process

    def discard_caches(self) -> None:
        """Its contents went (a clear, a loaded checkpoint): remove its caches' files."""
        for cache in (self.cache, self.large):
            if cache is not None:
                cache.discard()

    def gone(self, row: int) -> bool:
        """Has the writer, since this state was read, published a commit under which
        ``row`` is gone (evicted and its shard reclaimed, or the segment cleared or
        replaced)?  Then a failed read of it is no damage: draw again."""
        live = self.live_from()
        return live is None or row < live

    def live_from(self) -> int | None:
        """The first row that no commit published since this state was read has taken
        away (rows below it were evicted, perhaps reclaimed): what was read of rows from
        there on is theirs.  None: no row is (the segment was cleared, replaced or
        removed)."""
        seg_dir = self.segment.dir
        if self.stamp is not None and seg_dir.backend.is_local:
            if commit_stamp(seg_dir) == self.stamp:  # (a stat, not a read of the record)
                return 0  # nothing published since: the one commit read
        try:
            now = read_commit(seg_dir)
        except CorruptBufferError:
            return 0
        if now is None:
            return None  # the buffer was removed (overwrite=True) under the reader
        if now.gen == self.commit.gen and now.contents == self.commit.contents:
            return 0  # the one commit read, which the contents id makes unique
        if same_contents(self.commit, now) is False or now.n_rows < self.commit.n_rows:
            return None
        return max(now.low_row, now.reclaimed_below)


def segment_commits(path, storage_options: dict | None = None) -> list[tuple[str, Commit]]:
    """``(writer_id, commit)`` of every committed segment of the buffer at ``path``, in
    name order, read without opening any array (what a checkpoint load needs first)."""
    root = BufferRoot(path, storage_options)
    root.recover()  # a checkpoint saved over it that a crash interrupted
    root.read_meta()  # fails fast on a non-buffer
    out = []
    for wid in root.committed_ids():  # also a segment that committed before any array
        commit = read_commit(root.segment_dir(wid))
        if commit is not None:
            out.append((wid, commit))
    return out


def _continues(old: _CommitView, new: _CommitView) -> bool:
    same = same_contents(old.commit, new.commit)
    if same is not None:  # contents ids: never repeated, whatever rows and ids repeat
        return same
    j = old.index.n - 1  # commits before contents ids: the last trajectory id seen
    if j < 0:
        return True
    if new.index.n <= j or new.commit.n_rows < old.commit.n_rows:
        return False
    col = "trajectory_id"
    return int(new.index.column(col)[j]) == int(old.index.column(col)[j])


def default_chunk_cache_bytes() -> int:
    """A view's decoded-chunk cache per segment by default: a sixteenth of the machine's
    RAM (1.5 GiB on 24 GiB).  Clips of compressed images from disk are decode-bound
    without it (2.4x a memory map, benchmarks/HISTORY.md "Scale"); it fills only as far
    as the chunks a process reads, least recently used first out."""
    return default_budget() // 16


class BufferReader:
    """Read-only access to the committed contents of a buffer directory.

    ``column_cache_bytes``: bytes per segment of small keys kept decoded in the shared
    column cache file (default: the machine's RAM; 0: off; :mod:`zreplay.engine.colcache`);
    ``chunk_cache_bytes`` (default :func:`default_chunk_cache_bytes`, a sixteenth of the
    machine's RAM; 0: none): bytes per segment of the other keys (images) kept decoded:
    their newest rows in a second column cache file for a local buffer (filled by the
    first sample or clip read of them, never by an episode read; not kept where
    ``column_cache_bytes`` is 0), and chunks of the rows read from the store in this
    process's memory (TensorStore's ``cache_pool`` locally; in an object store, the
    chunks its requests brought back).

    A segment whose commit records ``view_rows`` shows only its trajectories that start
    within its newest ``view_rows`` rows (:func:`~zreplay.store.commit.view_low_traj`:
    ZarrStorage's ring hides the rows it overwrote this way); ``every_row=True`` shows
    every visible row of every segment instead (a reader that applies such a cut itself)."""

    writable = False
    closed = False

    def __init__(
        self,
        path,
        storage_options: dict | None = None,
        column_cache_bytes: int | None = None,
        chunk_cache_bytes: int | None = None,
        every_row: bool = False,
    ):
        self.every_row = bool(every_row)
        budget = default_budget() if column_cache_bytes is None else column_cache_bytes
        self.column_cache_bytes = int(budget)
        if chunk_cache_bytes is None:
            chunk_cache_bytes = default_chunk_cache_bytes()
        self.chunk_cache_bytes = int(chunk_cache_bytes)
        self.root = BufferRoot(path, storage_options)
        self.path = self.root.path
        # Decoded rows of large keys, shared like the small ones: clips at a memory map's
        # speed.  Locally only: from an object store its first read would download the
        # newest chunk_cache_bytes of them (it keeps the chunks it reads instead).
        local = self.path.backend.is_local
        big = self.chunk_cache_bytes if local and self.column_cache_bytes > 0 else 0
        self.large_cache_bytes = big
        self.root.recover()
        self.root.read_meta()  # fails fast on a non-buffer
        self._origin = Origin()  # inherited by a forked child, which reopens (check_process)
        self._segs: dict[str, _CommitView] = {}
        self._seg_keys: dict[str, int] = {}  # writer id -> a number the sampler keys it by
        self.schema = None
        self._layouts = None
        self._recorded = None  # the root's schema and layout JSON that schema was parsed from
        self._created = None  # the root's creation time: another one is another buffer
        self._commits: dict[str, Commit] = {}
        # Each segment's commit stamp, taken before its commit was read (see stale()).
        self._stamps: dict[str, tuple[object, object]] = {}
        self.refresh()

    @property
    def storage_options(self) -> dict:
        return self.path.backend.storage_options

    @property
    def created(self):
        """The root's creation time as last read: another value is another buffer made
        at the same path (``overwrite=True``)."""
        return self._created

    def check_process(self) -> bool:
        """In a process other than the one that opened it: reopen (True if it did)."""
        if not self._origin.inherited:
            return False
        self._origin = Origin()
        self._segs = {}
        self.schema = None
        self.refresh()
        return True

    # -- discovery ------------------------------------------------------------------

    def refresh(self) -> bool:
        """Re-read every segment's commit; returns True if anything new became visible.

        A writer may clear its segment, load a checkpoint into it or start the buffer
        afresh (``overwrite=True``) while this reads: what it then finds missing is no
        damage but a commit that moved on, so the refresh starts over on the new commit
        (``CorruptBufferError`` only for what ``zreplay.verify`` would flag too)."""
        if self.check_process():
            return True
        for attempt in range(RETRIES + 1):
            try:
                return self._refresh()
            except _MovedOn:
                if attempt == RETRIES:
                    raise EmptyBufferError(
                        f"{self.path}: its writers kept replacing their contents while this "
                        "reader opened them; open or refresh again"
                    ) from None
                time.sleep(0.005 * 2**attempt)
        raise AssertionError("unreachable")

    def _refresh(self) -> bool:
        try:
            return self._read_commits()
        except (FormatError, CorruptBufferError):
            if self._created is None:
                raise  # never a buffer this reader saw
            try:
                same = self.root.read_meta().get("created") == self._created
            except (FormatError, CorruptBufferError):
                same = False
            if same:
                raise
            raise _MovedOn() from None  # removed and being made again (overwrite=True)

    def _read_commits(self) -> bool:
        changed = False
        meta = self.root.read_meta()
        created = meta.get("created")
        if self._created is not None and created != self._created:
            # Another buffer at the same path (overwrite=True): nothing read before holds.
            self._segs, self.schema, self._layouts = {}, None, None
            changed = True
        self._created = created
        recorded = (meta.get("schema"), meta.get("layout"))
        if self.schema is None or recorded != self._recorded:  # parsed only when it changed
            schema, layouts = self.root.schema(meta)
            if self.schema is not None and (schema, layouts) != (self.schema, self._layouts):
                # A writer loaded a checkpoint of another schema or layout into the only
                # segment: no array handle opened for the old one may read the new one.
                for st in self._segs.values():
                    st.discard_caches()
                self._segs, changed = {}, True
            self.schema, self._layouts, self._recorded = schema, layouts, recorded
        if self.schema is None:
            self._rebuild()
            return changed
        seen, stamps = {}, {}
        for wid in self.root.writer_ids():
            seg_dir = self.root.segment_dir(wid)
            # Taken first: a commit published after it changes the stamp stale() reads.
            stamps[wid] = (seg_dir, commit_stamp(seg_dir))
            commit = shown_commit(self.root, wid)
            if commit is not None:
                seen[wid] = commit
            if commit is None or not reads_index(commit):
                # Nothing to read (never wrote, or cleared): its arrays may not exist (yet).
                changed |= self._drop(wid)
                continue
            st = self._segs.get(wid)
            if st is not None and (st.commit.gen, st.commit.contents) == (
                commit.gen,
                commit.contents,
            ):
                continue
            try:
                same = st is not None and same_contents(st.commit, commit) is not False
                seg = st.segment if same else self._open_segment(seg_dir)
                cols = seg.read_index(commit)
                low = commit.low_traj
                if not self.every_row:
                    low = view_low_traj(commit, cols["offsets"], str(seg_dir))
                index = TrajectoryIndex(cols, low=low)
            except CorruptBufferError as e:
                now = read_commit(seg_dir)
                if now is None or (now.gen, now.contents) != (commit.gen, commit.contents):
                    raise _MovedOn() from None
                again = self.root.read_meta()  # a load of another schema landed between
                if (again.get("schema"), again.get("layout")) != recorded:  # meta and commit
                    raise _MovedOn() from None
                raise segment_damaged(self.root, wid, e, commit) from None
            if not index.visible_rows:  # a sealed segment emptied before it was sealed
                changed |= self._drop(wid)
                continue
            budgets = (self.column_cache_bytes, self.large_cache_bytes)
            self._segs[wid] = _CommitView(seg, commit, index, budgets, before=st)
            self._seg_keys.setdefault(wid, len(self._seg_keys))
            changed = True
        self._commits, self._stamps = seen, stamps
        for wid, st in self._segs.items():
            st.stamp = stamps.get(wid, (None, None))[1]  # (None: its commit is read)
        self._rebuild()
        return changed

    def _drop(self, writer_id: str) -> bool:
        """Forget segment ``writer_id`` (it shows no rows now); True if it showed some."""
        gone = self._segs.pop(writer_id, None)
        if gone is not None:
            gone.discard_caches()  # the rows it held are nobody's any more
        return gone is not None

    def stale(self) -> bool:
        """Has a segment this reader knows published a commit since its last refresh
        (one ``stat`` of each segment's commit record locally)?  Segments of writers
        that joined since are found by :meth:`refresh` only."""
        if self.check_process():
            return False  # reopened just now
        if self.schema is None:
            return True  # nothing was ever visible: a refresh costs as little
        return any(commit_stamp(d) != stamp for d, stamp in self._stamps.values())

    def _open_segment(self, seg_dir) -> Segment:
        # Keys the column cache holds are read into it once: no chunk cache for them.
        small = set(small_keys(self.schema)) if self.column_cache_bytes > 0 else set()
        return Segment(
            seg_dir,
            self.schema,
            self._layouts,
            writable=False,
            chunk_cache_bytes=self.chunk_cache_bytes,
            chunk_cache_keys=frozenset(k for k in self.schema.keys if k not in small),
        )

    def _rebuild(self) -> None:
        states = [self._segs[w] for w in sorted(self._segs)]
        self._order = states
        rows = [s.index.visible_rows for s in states]
        trajs = [s.index.num_visible for s in states]
        self._cum_rows = np.concatenate([[0], np.cumsum(rows, dtype=np.int64)])
        self._cum_traj = np.concatenate([[0], np.cumsum(trajs, dtype=np.int64)])
        self._episodes: EpisodeView | None = None
        self._space: RowSpace | None = None
        self._snapshot: Snapshot | None = None

    def segments(self) -> list[tuple[str, Commit]]:
        """``(writer_id, commit)`` of every visible segment, in name order."""
        return [(s.segment.writer_id, s.commit) for s in self._order]

    def visible_trajectories(self) -> list[tuple[str, Commit, int]]:
        """``(writer_id, commit, first)`` of every visible segment, in name order: this
        reader shows its trajectories ``[first, commit.n_traj)`` (``first`` is above
        ``commit.low_traj`` where the commit's ``view_rows`` hides older ones)."""
        return [(s.segment.writer_id, s.commit, s.index.low) for s in self._order]

    def commits(self) -> list[tuple[str, Commit]]:
        """``(writer_id, commit)`` of every committed segment as of the last refresh,
        empty ones (cleared, or all evicted) included, in name order."""
        return sorted(self._commits.items())

    def episodes(self) -> EpisodeView:
        """The visible episodes of every segment (rows as visible positions)."""
        if self._episodes is None:
            parts = []
            for si, st in enumerate(self._order):
                p = dict(st.index.pieces.visible())
                p["start"] = positions_of(p["start"], st.index.low_row, self._cum_rows[si])
                parts.append(p)
            self._episodes = EpisodeView(concat_pieces(parts))
        return self._episodes

    def space(self) -> RowSpace:
        """The visible rows as sampler positions (built once per refresh); each segment's
        saved priorities are read from what its writer saved."""
        if self._space is None:
            offs, segs = [], []
            for si, st in enumerate(self._order):
                idx, first = st.index, int(self._cum_rows[si])
                offs.append(positions_of(idx.offsets[idx.low : idx.n], idx.low_row, first))
                segs.append(
                    VisibleRows(
                        key=self._seg_keys[st.segment.writer_id],
                        epoch=st.epoch,
                        low_row=idx.low_row,
                        n_rows=idx.n_rows,
                        first=first,
                        persisted=lambda st=st: saved_priorities(st.segment.dir, st.commit),
                        index=idx,
                        sealed=st.commit.sealed,
                    )
                )
            offsets = np.concatenate([*offs, self._cum_rows[-1:]]).astype(np.int64)
            self._space = RowSpace(offsets, self._cum_traj.astype(np.int64), segs, self._column)
        return self._space

    def _column(self, key: str, positions: np.ndarray) -> np.ndarray:
        """Stored rows of ``key`` at visible positions (for samplers that weigh rows by a
        stored column); ``Evicted`` makes the read start over on a fresh snapshot."""
        return gather(self.snapshot(), {key: (key, positions)})[key]

    # -- shape of the data ----------------------------------------------------------

    @property
    def num_rows(self) -> int:
        return int(self._cum_rows[-1])

    @property
    def num_trajectories(self) -> int:
        return int(self._cum_traj[-1])

    @property
    def writer_ids(self) -> list[str]:
        return [s.segment.writer_id for s in self._order]

    @property
    def next_trajectory_id(self) -> int:
        return max((s.commit.next_trajectory_id for s in self._order), default=0)

    # -- reads ----------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The visible rows as of the last refresh."""
        if self._snapshot is None:
            parts = [
                Part(
                    segment=st.segment,
                    index=st.index,
                    low_row=st.index.low_row,
                    n_rows=st.index.n_rows,
                    first=int(self._cum_rows[si]),
                    reclaimed=st.gone,
                    live_from=st.live_from,
                    cache=st.cache,
                    large_cache=st.large,
                    cache_id=st.cache_id,
                )
                for si, st in enumerate(self._order)
            ]
            self._snapshot = Snapshot(
                self.schema, parts, self.episodes, self.space, bounds=self._cum_rows
            )
        return self._snapshot

    def read(
        self, draw: Callable[[Snapshot], object], alloc=None, redraw: bool = True
    ) -> tuple[object, dict]:
        """``draw(snapshot)``, then gather what it asks for (as ``SegmentWriter.read``).
        If its rows were evicted meanwhile: with ``redraw`` (a random draw) the reader
        refreshes and draws again; without (positions the caller chose, which name other
        rows, or none, on another snapshot) :class:`StaleViewError`."""
        self.check_process()
        for _ in range(RETRIES):
            snap = self.snapshot()
            try:  # a draw may read too (a sampler weighing rows by a stored column)
                drawn = draw(snap)
                if self.schema is None:
                    return drawn, {}
                pending = gather_begin(snap, as_requests(drawn, self.schema), alloc)
                return drawn, gather_finish(pending)
            except Evicted:
                if not redraw:
                    raise StaleViewError(
                        f"{self.path}: rows this view's snapshot shows were removed by a "
                        "writer since it was taken (cleared, evicted, or replaced by a "
                        "loaded checkpoint); call refresh() and index again (positions "
                        "may name other rows after it)"
                    ) from None
                self.refresh()
        raise EmptyBufferError("rows kept being evicted while reading; sample again")

    def locked(self, fn: Callable[[Snapshot], object]) -> object:
        """``fn(snapshot)`` (a reader has no lock: its snapshot changes only on refresh)."""
        self.check_process()
        return fn(self.snapshot())

    def empty_message(self) -> str:
        return f"{self.path} holds no committed transitions"

    def close(self) -> None:
        """Nothing to release: a reader holds no lock, and its caches are shared files
        or memory that go with it."""

    def segment_rows(self, start: int = 0, stop: int | None = None) -> list[tuple[str, int, int]]:
        """Visible trajectories ``[start, stop)`` as ``(writer_id, first_row, stop_row)``
        per segment.  Segment rows are never reused, so unlike positions (which shift when
        an earlier segment grows or evicts) they name the same rows after a ``refresh()``
        and in another process."""
        stop = self.num_trajectories if stop is None else stop
        if not 0 <= start <= stop <= self.num_trajectories:
            raise IndexError(f"[{start}, {stop}) is not within [0, {self.num_trajectories}]")
        out = []
        for si, st in enumerate(self._order):
            lo = max(start, int(self._cum_traj[si])) - int(self._cum_traj[si])
            hi = min(stop, int(self._cum_traj[si + 1])) - int(self._cum_traj[si])
            if hi > lo:
                off = st.index.offsets
                j0, j1 = st.index.low + lo, st.index.low + hi
                out.append((st.segment.writer_id, int(off[j0]), int(off[j1])))
        return out

    def positions_of(self, writer_id: str, rows) -> np.ndarray:
        """Current positions of rows of segment ``writer_id``; an IndexError if any is not
        visible (evicted, or not yet seen by ``refresh()``)."""
        rows = np.asarray(rows, np.int64)
        for si, st in enumerate(self._order):
            if st.segment.writer_id == writer_id:
                idx = st.index
                if rows.size and (rows.min() < idx.low_row or rows.max() >= idx.n_rows):
                    raise IndexError(
                        f"rows of segment {writer_id!r} outside its visible rows "
                        f"[{idx.low_row}, {idx.n_rows}) (evicted, or refresh() first)"
                    )
                return positions_of(rows, idx.low_row, self._cum_rows[si])
        raise IndexError(f"{self.path} has no visible segment {writer_id!r}")
