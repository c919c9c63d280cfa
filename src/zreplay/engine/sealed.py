"""Sealed segments: a buffer's immutable offline part, and how a writer samples it.

A segment is *sealed* when its commit record says so (``"sealed": true``, FORMAT.md
"Sealed segments"): an import (``import_lerobot``, ``import_minari``) seals the segment it
writes, and :func:`seal` seals any committed segment.  No writer opens a sealed segment
again (:class:`~zreplay.errors.SealedSegmentError`), so nothing evicts, clears or rewrites
its rows.  A writer of another segment of the same buffer opens every sealed segment once,
when it opens (:func:`open_sealed`: their commits and indexes never change), and its
snapshots lay them out beside its own rows as read-only parts (:func:`snapshot_with`),
segments in name order as a view lays them, so sampling, n-step and clips see offline and
online rows alike, and an episode never crosses a part.  A writer with no sealed segment
beside it takes none of this path.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import CorruptBufferError, FormatError
from ..index.coords import positions_of
from ..index.episodes import EpisodeView, concat_pieces
from ..index.rowspace import RowSpace, VisibleRows
from ..index.trajectories import TrajectoryIndex
from ..schema import check_key_component
from ..store.commit import Commit, read_commit, view_low_traj, write_commit
from ..store.lock import WriterLock
from ..store.root import BufferRoot, is_buffer
from ..store.segment import Segment
from ..threads import deferred_interrupts
from .colcache import ColumnCache, contents_ident, small_keys
from .gather import Part, Snapshot, gather
from .reader import default_chunk_cache_bytes, reads_index, segment_damaged, shown_commit

# The segment an import writes and seals, beside the "default" a writer opens.
OFFLINE_WRITER = "offline"


class SealedPart:
    """One sealed segment as a writer samples it: opened once, its index read once.
    ``key`` names it in the writer's row space (the writer's own segment is key 0)."""

    def __init__(self, key: int, commit: Commit, segment: Segment, budget: int):
        self.key, self.commit, self.segment = key, commit, segment
        self.writer_id = segment.writer_id
        self.index = TrajectoryIndex(segment.read_index(commit), low=commit.low_traj)
        self.epoch = object()  # its rows are never renumbered while the writer lives
        self.cache = ColumnCache(segment.schema, budget, wait=False) if budget > 0 else None
        self.cache_id = contents_ident(segment.dir, commit.contents)

    @property
    def size(self) -> int:
        return self.index.visible_rows

    def part(self, first: int) -> Part:
        idx = self.index
        return Part(
            segment=self.segment,
            index=idx,
            low_row=idx.low_row,
            n_rows=idx.n_rows,
            first=first,
            cache=self.cache,
            cache_id=self.cache_id,
        )


def open_sealed(root: BufferRoot, own: str, budget: int) -> list[SealedPart]:
    """Every sealed segment of ``root`` with visible rows other than ``own`` (the
    writer's), in name order, opened read-only; ``budget``: bytes of each one's column
    cache of small keys (0: none).  Every other segment's commit is read as a view reads
    it, and a sealed one's index checked as a view checks it: damage (or a record that
    cannot be read, which may be the sealed part's) is the view's CorruptBufferError,
    raised before the writer makes or changes anything."""
    if not is_buffer(root.path):
        return []
    schema, layouts = root.schema()
    if schema is None:
        return []
    out = []
    for wid in root.writer_ids():
        if wid == own:
            continue
        try:
            commit = shown_commit(root, wid)
        except FormatError as e:
            if getattr(e, "older", False):
                # Another writer's segment an older zreplay wrote: sealing came with
                # format 5, so it is not a sealed part; views and verify report it.
                continue
            raise
        if commit is None or not commit.sealed or not reads_index(commit):
            continue
        # As a view opens it: a decoded-chunk cache for the keys the column cache skips
        # (the rows never change, so nothing cached ever goes stale).
        small = set(small_keys(schema)) if budget > 0 else set()
        try:
            segment = Segment(
                root.segment_dir(wid),
                schema,
                layouts,
                writable=False,
                chunk_cache_bytes=default_chunk_cache_bytes(),
                chunk_cache_keys=frozenset(k for k in schema.keys if k not in small),
            )
            part = SealedPart(len(out) + 1, commit, segment, budget)
            view_low_traj(commit, part.index.offsets, str(segment.dir))  # as a view checks it
        except CorruptBufferError as e:
            raise segment_damaged(root, wid, e, commit) from None
        if part.size:
            out.append(part)
    return out


def sealed_moved(sealed: list[SealedPart]) -> bool:
    """Whether a segment of ``sealed`` (as :func:`open_sealed` opened them) holds other
    contents now: the buffer was replaced since (an import over it)."""
    for part in sealed:
        commit = read_commit(part.segment.dir)
        if commit is None or commit.contents != part.commit.contents:
            return True
    return False


class SealedLayout:
    """A writer's snapshots with its sealed parts beside its own rows, in segment name
    order.  The episodes and row space are rebuilt only when the writer's own visible
    rows changed (an add, an eviction, a clear): the sealed parts never change."""

    def __init__(self, writer_id: str, sealed: list[SealedPart]):
        self.sealed = sealed
        names = sorted([writer_id, *(s.writer_id for s in sealed)])
        self.own_at = names.index(writer_id)
        by_name = {s.writer_id: s for s in sealed}
        self.order = [by_name.get(n) for n in names]  # None: the writer's own segment
        self.rows = sum(s.size for s in sealed)
        self.trajectories = sum(s.index.num_visible for s in sealed)
        self._made: tuple | None = None  # (own index, low_row, n_rows, episodes, space)

    def snapshot(self, own: Part, schema, persisted: Callable) -> Snapshot:
        """``own`` (the writer's part, at position 0 as made) among the sealed parts."""
        parts, first = [], 0
        for s in self.order:
            if s is None:
                own.first = first
                parts.append(own)
                first += own.n_rows - own.low_row
            else:
                parts.append(s.part(first))
                first += s.size
        idx = own.index
        made = self._made
        if made is None or made[0] is not idx or made[1:3] != (own.low_row, own.n_rows):
            made = self._made = (idx, own.low_row, own.n_rows, None, None)
        key = made[:3]

        def episodes() -> EpisodeView:
            m = self._made
            if m[:3] == key and m[3] is not None:
                return m[3]
            view = EpisodeView(concat_pieces([_pieces(p) for p in parts]))
            if self._made[:3] == key:
                self._made = (*key, view, self._made[4])
            return view

        def space() -> RowSpace:
            m = self._made
            if m[:3] == key and m[4] is not None:
                return m[4]
            sp = self._space(parts, persisted, lambda k, pos: gather(snap, {k: (k, pos)})[k])
            if self._made[:3] == key:
                self._made = (*key, self._made[3], sp)
            return sp

        snap = Snapshot(schema, parts, episodes, space)
        return snap

    def _space(self, parts: list[Part], persisted, read) -> RowSpace:
        offs, segs, counts = [], [], []
        for s, p in zip(self.order, parts, strict=True):
            idx = p.index
            offs.append(positions_of(idx.offsets[idx.low : idx.n], p.low_row, p.first))
            counts.append(idx.num_visible)
            segs.append(
                VisibleRows(
                    key=0 if s is None else s.key,
                    epoch=idx if s is None else s.epoch,
                    low_row=p.low_row,
                    n_rows=p.n_rows,
                    first=p.first,
                    persisted=persisted if s is None else None,
                    index=idx,
                    sealed=s is not None,
                )
            )
        total = sum(p.n_rows - p.low_row for p in parts)
        offsets = np.concatenate([*offs, [total]]).astype(np.int64)
        bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return RowSpace(offsets, bounds, segs, read)


def _pieces(part: Part) -> dict:
    p = dict(part.index.pieces.visible())
    p["start"] = positions_of(p["start"], part.low_row, part.first)
    return p


def seal(path, writer_id: str = "default", storage_options: dict | None = None) -> None:
    """Mark segment ``writer_id`` of the buffer at ``path`` sealed: an immutable offline
    part that no writer opens again (``SealedSegmentError``) and that the writers of the
    buffer's other segments sample beside their own rows (``samplers.Mixed`` draws an
    exact fraction of each batch from it).  Takes the segment's writer lock (a
    ``WriterLockedError`` while a writer has it open: close that writer first); the seal
    is one atomic replace of its commit record.  Sealing a sealed segment changes nothing.
    """
    check_key_component(writer_id, "segments")
    root = BufferRoot(path, storage_options)
    root.read_meta()  # fails fast on a non-buffer
    seg_dir = root.segment_dir(writer_id)
    commit = read_commit(seg_dir) if seg_dir.exists() else None
    if commit is None:
        raise FormatError(
            f"{root.path}: no committed segment {writer_id!r} to seal (segments: "
            f"{root.committed_ids()}); write and close a buffer with this writer_id first"
        )
    if commit.sealed:
        return
    lock = WriterLock(seg_dir)
    try:
        # A Ctrl-C while the lock is taken is raised as the block ends, the lock taken:
        # inside the try, so that it is released then too.
        with deferred_interrupts():
            lock.acquire()
        commit = read_commit(seg_dir)  # what the writer that last held the lock left
        with lock.fenced():
            sealed = Commit(**{**vars(commit), "gen": commit.gen + 1, "sealed": True})
            write_commit(seg_dir, sealed)
    finally:
        with deferred_interrupts():
            lock.release()
