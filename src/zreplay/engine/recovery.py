"""Opening a writer's segment: what its last commit says, with the debris of a crash removed.

A writer killed at any moment leaves its previous commit intact; on the next open, under
the writer lock, temp files of writes in flight are removed, shards that the commit says
were reclaimed but a killed reclaim left behind are deleted, the arrays are cut back to
the commit's length, and everything past the commit (rows, index entries) is ignored:
the in-RAM index is read up to the commit only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..errors import (
    CorruptBufferError,
    FormatError,
    SealedSegmentError,
    WriteFailedError,
    WriterLockedError,
)
from ..index.split import Lanes, lanes_after
from ..index.trajectories import TrajectoryIndex
from ..schema import Schema
from ..store.commit import Commit, read_commit, remove_orphans
from ..store.format import ID_BITS, commit_path
from ..store.guard import holding_writer_locks, live_writer
from ..store.layout import check_recorded, layouts_for
from ..store.root import BufferRoot, is_buffer, leftover_of_buffer
from ..store.segment import Segment
from . import replace

log = logging.getLogger(__name__)


@dataclass
class Recovered:
    """A writer's segment as its last commit left it: what opening it after a crash (or
    a clean close) recovers, and what a clear or a load starts its writer from again."""

    commit: Commit
    schema: Schema | None
    layouts: dict | None
    segment: Segment | None
    index: TrajectoryIndex
    lanes: Lanes | None
    next_trajectory_id: int
    next_episode: int
    largest_trajectory: int  # rows of the largest visible trajectory (sizes the RAM tier)

    @classmethod
    def empty(
        cls, commit: Commit, schema: Schema | None, layouts: dict | None, next_trajectory_id: int
    ) -> Recovered:
        """Nothing read yet (no arrays, an empty index whose rows start at the commit's
        ``n_rows``), ids going on from ``next_trajectory_id`` and the commit's next
        episode."""
        return cls(
            commit=commit,
            schema=schema,
            layouts=layouts,
            segment=None,
            index=TrajectoryIndex(first_row=commit.n_rows),
            lanes=None,
            next_trajectory_id=next_trajectory_id,
            next_episode=commit.next_episode,
            largest_trajectory=1,
        )


def open_arrays(seg_dir, schema: Schema, layouts: dict, durable: bool) -> Segment:
    """The segment's arrays, created (or completed) first if needed."""
    Segment.create_arrays(seg_dir, schema.specs, layouts)
    return Segment(seg_dir, schema, layouts, writable=True, durable=durable)


def fix_schema(root: BufferRoot, seg_dir, schema: Schema, overrides, durable: bool):
    """Fix the buffer's schema (or take the one already fixed, which must be the same)
    and create this segment's arrays in the layout every segment uses; returns
    ``(layouts, segment)``.  A failed write is a WriteFailedError; both steps are
    idempotent, so the next add completes what a failed one began."""
    try:
        with root.schema_guard():  # see open_segment
            layouts = root.set_schema(schema, layouts_for(schema.specs, overrides))
            check_recorded(schema.specs, layouts, overrides)
            return layouts, open_arrays(seg_dir, schema, layouts, durable)
    except OSError as e:
        raise WriteFailedError(
            f"could not create the arrays of {seg_dir} ({type(e).__name__}: {e}); "
            "nothing was added. Fix the cause (disk space, permissions) and add again"
        ) from e


def _open_locked(root: BufferRoot, seg_dir, writer_id: str, durable: bool) -> Recovered:
    """Finish a replacement a crash interrupted, read the commit, remove a killed
    writer's temp files and open (creating if needed) the arrays, in the recorded layout;
    the segment is None while no schema is fixed."""
    replace.recover(root, seg_dir, durable)
    schema, layouts = root.schema()
    commit = read_commit(seg_dir) or Commit(writer_id=writer_id)
    if commit.sealed:
        raise SealedSegmentError(
            f"{seg_dir}: segment {writer_id!r} is sealed (an imported dataset's offline "
            "part): no writer opens it again. Open the buffer with another writer_id "
            "(e.g. writer_id='online'): its writer samples the sealed rows beside its own"
        )
    if commit.writer_number < 0:
        commit = Commit(**{**vars(commit), "writer_number": root.writer_number(writer_id)})
    # Shard files c.<s>... of an array, or the subtrees c/<s>/ of one made before format 5
    committed = {
        str(d): commit.n_rows // lay.shard_rows
        for k, lay in (layouts or {}).items()
        for d in (seg_dir / "data" / k, seg_dir / "data" / k / "c")
    }
    remove_orphans(seg_dir, committed)
    next_id = max(commit.next_trajectory_id, commit.writer_number << ID_BITS)
    opened = Recovered.empty(commit, schema, layouts, next_id)
    if schema is None:
        return opened
    missing = Segment.missing_arrays(seg_dir, schema.specs)
    if missing and commit.n_traj:
        # Recreating them would serve fill values as committed data.
        raise CorruptBufferError(
            f"{seg_dir}: arrays {missing} are missing, but commit.json says "
            f"{commit.n_traj} trajectories were committed; restore the segment from "
            "a checkpoint (zreplay.verify(path) reports all damage)"
        )
    opened.segment = open_arrays(seg_dir, schema, layouts, durable)
    return opened


def open_segment(root: BufferRoot, writer_id: str, durable: bool) -> Recovered:
    """Recover and read segment ``writer_id`` of ``root`` (the caller holds its lock)."""
    seg_dir = root.segment_dir(writer_id)
    # A load that changes the recorded layout cannot land between reading it and
    # creating this segment's arrays in it (replace._check_replaceable).
    with root.schema_guard():
        opened = _open_locked(root, seg_dir, writer_id, durable)
    seg = opened.segment
    if seg is None:
        return opened
    commit = opened.commit
    if commit.reclaimed_below:
        seg.remove_reclaimed(commit.reclaimed_below)
    cols = seg.read_index(commit)  # damage is refused before the lengths follow the commit
    # A commit killed after its arrays grew left them longer (and live_rows behind);
    # buffers written before data arrays were kept exactly as long as their commit
    # show padding until now.
    try:  # for plain-zarr readers only: zreplay reads the commit
        seg.set_lengths(commit.n_rows, commit.n_traj, commit.n_pieces)
        seg.publish_live_rows(commit.low_row, commit.n_rows, durable)
    except (OSError, ValueError) as e:  # TensorStore reports I/O errors as ValueError
        log.warning("zreplay: could not set %s's array lengths to its commit: %r", seg_dir, e)
    index = opened.index = TrajectoryIndex(cols, low=commit.low_traj)
    if index.n:
        i = index.n - 1
        p0 = int(cols["piece_end"][i - 1]) if i else 0
        last = {c: v[p0:] for c, v in cols["pieces"].items()}
        opened.lanes = lanes_after(
            last, int(index.offsets[i]), int(cols["T"][i]), int(cols["B"][i])
        )
        sizes = cols["T"] * cols["B"]
        opened.largest_trajectory = int(sizes[index.low :].max(initial=1))
    return opened


def remove_for_overwrite(path) -> None:
    """Delete the buffer at ``path`` (``overwrite=True``): refused while any of its
    segments has a live writer (or another replacement holds it), and for anything that
    is not a zreplay buffer.  It is removed holding the buffer's own writer lock and every
    segment's, as a replacement does (store/guard.py), so a writer opening it meanwhile
    is refused instead of writing into a tree being deleted."""
    if is_buffer(path):
        found = live_writer(path)
        if found is not None:
            wid, info = found
            raise WriterLockedError(
                f"overwrite=True refused: segment {wid!r} of {path} is being "
                f"written by pid {info.get('pid')} on host {info.get('host')!r}; "
                "close that writer first"
            )
        with holding_writer_locks(path, "overwrite=True refused"):
            _remove_buffer(path)
    elif leftover_of_buffer(path):
        path.backend.remove_tree(path)  # what a removal raced by a learner's publish left
    elif any(True for _ in path.iterdir()):
        raise FormatError(
            f"overwrite=True refused: {path} is not a zreplay buffer; delete it yourself"
        )


def _remove_buffer(path) -> None:
    """Remove a buffer so that its readers see it go, never damage: its root
    ``zarr.json`` first (opens and refreshes then know it is being made again), then
    every segment's commit record (a read that then fails is a replaced segment's, not
    damage), then everything (in whatever order the filesystem lists it)."""
    (path / "zarr.json").unlink(missing_ok=True)
    root = BufferRoot(path)
    for wid in root.committed_ids():
        commit_path(root.segment_dir(wid)).unlink(missing_ok=True)
    path.backend.remove_tree(path)
