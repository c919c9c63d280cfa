"""Replacing a segment's contents all at once (loading a checkpoint into it).

The new contents are built aside, in a staging buffer inside the segment's meta node
(``<segment>/zreplay/staging``, where no reader looks): hard links to a checkpoint's
files, or trajectories added to it like to any buffer.  A failure while building leaves
the segment untouched and the staging removed.  Then one atomic write of an *intent*
record (``<segment>/zreplay/replace.json``: the staged commit, schema and layout) is the
point of no return: the swap that follows (an emptying commit, the staged arrays moved in
place of the old ones, the schema, the staged commit, cleanup) is idempotent, and a
writer that finds the intent when it opens the segment finishes it.  So a crash at any
moment leaves the old contents or the new ones.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from ..errors import CorruptBufferError, SchemaError
from ..schema import Schema
from ..store.arraymeta import check_array
from ..store.checkpoint import link_tree
from ..store.commit import Commit, new_contents, read_commit, write_commit
from ..store.format import META, SEGMENT_CHILDREN, intent_path, meta_node_json, staging_root
from ..store.layout import KeyLayout
from ..store.root import BufferRoot
from ..store.segment import Segment
from ..threads import deferred_interrupts


@dataclass
class Adoptable:
    """A committed segment whose trajectories another writer adopts by hard links."""

    seg_dir: object
    schema: Schema
    layouts: dict
    commit: Commit
    offsets: object
    piece_end: object

    def commit_for(
        self, current: Commit, first: int, stop: int, next_id: int, sampler: dict
    ) -> Commit:
        """The adopting writer's commit (after ``current``) showing trajectories
        ``[first, stop)`` of this segment."""
        off, ends, src = self.offsets, self.piece_end, self.commit
        return Commit(
            writer_id=current.writer_id,
            gen=current.gen + 1,
            n_rows=int(off[stop]),
            n_traj=stop,
            low_row=int(off[first]),
            low_traj=first,
            reclaimed_below=src.reclaimed_below,
            next_trajectory_id=max(next_id, src.next_trajectory_id),
            n_pieces=int(ends[stop - 1]) if stop else 0,
            low_piece=int(ends[first - 1]) if first else 0,
            next_episode=src.next_episode,
            writer_number=current.writer_number,
            sampler=sampler,
        )


def read_adoptable(src_root, src_writer: str) -> Adoptable:
    """Segment ``src_writer`` of the buffer at ``src_root``, read up to its commit."""
    src = BufferRoot(src_root)
    schema, layouts = src.schema()
    src_dir = src.segment_dir(src_writer)
    commit = read_commit(src_dir)
    # The index is read (and checked against the commit, as every open does); the data
    # arrays are checked from their zarr.json alone, not opened: nothing the swap would
    # find damaged only after its point of no return, at a fraction of the cost.
    cols = Segment(src_dir, Schema({}), {}, writable=False).read_index(commit)
    # (the shard of its last live row: its shard files are named as zarr.json says)
    last = commit.n_rows - 1 if commit.n_rows > commit.low_row else None
    for key, spec in (schema.specs if schema is not None else {}).items():
        problems, _ = check_array(
            src_dir / "data" / key, spec.dtype, spec.row_shape, None, commit.n_rows, last
        )
        if problems:
            raise CorruptBufferError(f"{problems[0]}; the checkpoint is damaged")
    return Adoptable(src_dir, schema, layouts, commit, cols["offsets"], cols["piece_end"])


@dataclass
class Intent:
    """A staged replacement of segment ``writer_id``, ready to be swapped in."""

    writer_id: str
    commit: Commit
    schema: Schema | None
    layouts: dict | None
    children: list[str]  # the segment's children the staging holds

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "writer_id": self.writer_id,
                "commit": asdict(self.commit),
                "schema": None if self.schema is None else self.schema.to_json(),
                "layout": None
                if not self.layouts
                else {k: vars(v) for k, v in self.layouts.items()},
                "children": self.children,
            }
        ).encode()

    @classmethod
    def from_json(cls, text: bytes, where) -> Intent:
        """The intent ``text`` (read from ``where``), its commit checked as any commit
        record read from disk (CorruptBufferError naming ``where``): finishing it
        publishes that commit over the segment's."""
        try:
            d = json.loads(text)
            commit = Commit.from_json(json.dumps(d["commit"]), str(where))
            schema = None if d["schema"] is None else Schema.from_json(d["schema"])
            layouts = (
                None
                if d["layout"] is None
                else {k: KeyLayout.from_json(v) for k, v in d["layout"].items()}
            )
            return cls(str(d["writer_id"]), commit, schema, layouts, list(d["children"]))
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise CorruptBufferError(
                f"{where}: the record of an interrupted checkpoint load is unreadable ({e}); "
                "restore the buffer from a checkpoint"
            ) from None


def _staging(seg_dir):
    """Where the segment's replacement is built: written and removed whole, so it must
    be the segment's own directory, not a link out of it."""
    path = staging_root(seg_dir)
    path.backend.confine(seg_dir, path)
    return path


def new_staging(seg_dir, writer_id: str, base: Commit | None = None) -> BufferRoot:
    """An empty staging buffer for segment ``writer_id`` (anything left of an earlier one
    removed).  ``base``: the segment's staged rows, trajectory ids and episode ids go on
    from where this commit left them (never reused), and it keeps its writer number."""
    root = BufferRoot(_staging(seg_dir))
    root.backend.remove_tree(root.path)
    root.create()
    if base is not None:
        seg = root.segment_dir(writer_id)
        seg.mkdir(parents=True, exist_ok=True)
        root.create_meta_node(seg)
        start = Commit(
            writer_id=writer_id,
            gen=base.gen,
            n_rows=base.n_rows,
            low_row=base.n_rows,
            reclaimed_below=base.n_rows,
            next_trajectory_id=base.next_trajectory_id,
            next_episode=base.next_episode,
            writer_number=base.writer_number,
        )
        write_commit(seg, start)
    return root


def stage_links(seg_dir, writer_id: str, src: Adoptable, commit: Commit) -> Intent:
    """Stage trajectories of ``src`` by hard-linking its files (``commit`` says which)."""
    root = new_staging(seg_dir, writer_id)
    root.set_schema(src.schema, src.layouts)
    staged = root.segment_dir(writer_id)
    link_tree(src.seg_dir, staged)
    return Intent(writer_id, commit, src.schema, src.layouts, _children(staged))


def staged_intent(seg_dir, writer_id: str, gen: int, sampler: dict) -> Intent:
    """The intent for what a writer committed into the staging buffer: its last commit
    (numbered after generation ``gen``, carrying ``sampler``), schema and layout."""
    root = BufferRoot(_staging(seg_dir))
    schema, layouts = root.schema()
    staged = root.segment_dir(writer_id)
    commit = read_commit(staged)
    commit.gen, commit.sampler = gen + 1, dict(sampler)
    return Intent(writer_id, commit, schema, layouts, _children(staged))


def _children(staged) -> list[str]:
    return [c for c in SEGMENT_CHILDREN if (staged / c).exists()]


def discard(seg_dir) -> None:
    """Remove a staging buffer (a replacement that failed before its intent)."""
    path = _staging(seg_dir)
    path.backend.remove_tree(path)


def finish(root: BufferRoot, seg_dir, intent: Intent, durable: bool) -> None:
    """Carry out a published intent (again, after a crash: every step can be redone)."""
    backend = seg_dir.backend
    staged = BufferRoot(_staging(seg_dir)).segment_dir(intent.writer_id)
    for child in SEGMENT_CHILDREN:
        src, dst = staged / child, seg_dir / child
        if child in intent.children:
            if src.exists():  # not moved yet (or moved only in part: start over)
                backend.remove_tree(dst)
                backend.move_tree(src, dst)
        else:
            backend.remove_tree(dst)
    if (staged / "zarr.json").is_file() and not (seg_dir / "zarr.json").is_file():
        backend.import_file(staged / "zarr.json", seg_dir / "zarr.json", link=False)
    if not (seg_dir / META / "zarr.json").is_file():
        backend.create_exclusive(seg_dir / META / "zarr.json", meta_node_json())
    current, recorded = root.schema()
    if current != intent.schema or recorded != intent.layouts:  # the arrays' layout too
        root.replace_schema(intent.schema, intent.layouts)
    write_commit(seg_dir, intent.commit, durable=durable)
    discard(seg_dir)
    intent_path(seg_dir).unlink(missing_ok=True)


def recover(root: BufferRoot, seg_dir, durable: bool) -> None:
    """On opening a segment (its lock held): finish a published replacement, or remove a
    staging buffer whose replacement never got that far."""
    try:
        text = intent_path(seg_dir).read_bytes()
    except FileNotFoundError:
        if _staging(seg_dir).exists():
            discard(seg_dir)
        return
    finish(root, seg_dir, Intent.from_json(text, intent_path(seg_dir)), durable)


# -- a writer's replacements (the writer is passed in: it holds the locks and the state) --


def adopt(writer, src_root, src_writer: str, first: int, stop: int, sampler: dict) -> None:
    """Replace ``writer``'s segment with trajectories ``[first, stop)`` of a zreplay segment
    by hard-linking its files (no data copy; the rows keep their numbers); all or nothing."""
    src = read_adoptable(src_root, src_writer)
    with writer.exclusive():
        with writer.cond:
            st = writer.state
            commit = src.commit_for(st.commit, first, stop, st.next_trajectory_id, sampler)
            commit.gen = st.commit.gen + 2  # after the emptying commit of swap_in
            _check_replaceable(writer, src.schema, src.layouts)
            _swap(writer, stage_links(writer.seg_dir, writer.writer_id, src, commit))


def clear(writer) -> None:
    """Empty ``writer``'s segment, on disk too.

    One commit makes the segment empty (the commit point: a crash before it leaves
    everything, after it nothing visible); its arrays are deleted after it.  Rows,
    trajectory ids and episode ids keep counting up (never reused), and the random
    stream goes on.  The schema is kept.
    """
    with writer.exclusive():
        # Ctrl-C held back from here to the emptied state: a Ctrl-C in between would
        # leave disk reads held off (quiescent) or the state not matching the commit.
        with deferred_interrupts(), writer.cond, writer.quiescent():
            st = writer.state  # (samples reading rows from disk finish first)
            commit = st.cleared_commit(writer.source)
            with writer.lock.fenced():
                write_commit(writer.seg_dir, commit, durable=writer.durable)  # commit point
            st.empty_to(commit)
        # Past the commit point only tidying is left: if it fails, the next open removes
        # what is left (every row is reclaimed), and the next add opens arrays again.
        writer.root.remove_segment_data(writer.writer_id)
        with writer.cond:
            writer.reopen()


@contextlib.contextmanager
def replacement(writer) -> Iterator:
    """Build ``writer``'s new contents aside: yields the root of a staging buffer whose
    segment of the same writer id goes on from the segment's rows and ids; what
    :func:`swap_in_staged` does not swap in before the block ends is discarded."""
    with writer.exclusive():
        with writer.cond:
            base = writer.state.next_commit_base()
        root = new_staging(writer.seg_dir, writer.writer_id, base)
        try:
            yield root.path
        finally:
            discard(writer.seg_dir)


def swap_in_staged(writer, sampler: dict) -> None:
    """Swap in what was committed to the staging buffer of :func:`replacement` (call it
    inside the block), with ``sampler`` as the new commit's sampler state."""
    with writer.cond:
        gen = writer.state.commit.gen + 1
        intent = staged_intent(writer.seg_dir, writer.writer_id, gen, sampler)
        _swap(writer, intent)  # checks it may replace the segment (_swap_quiescent)


def _others(writer) -> bool:
    return bool(set(writer.root.writer_ids()) - {writer.writer_id})


def staging_layout(writer) -> dict:
    """``layout=`` for a staging writer building ``writer``'s new contents: the recorded
    layout where other writers' segments are stored in it (the new contents must be
    too), else ``writer``'s own overrides."""
    if _others(writer):
        recorded = writer.root.schema()[1]
        if recorded:
            return {k: vars(v) for k, v in recorded.items()}
    return writer.layout_overrides


def _check_replaceable(writer, schema, layouts) -> None:
    """SchemaError if the new contents would change the schema or the layout (chunk and
    shard rows, codecs) that other writers' segments of the buffer are stored in: every
    segment is read, evicted and reclaimed by the one the root records.  Checked again
    under the root's schema guard right before the swap (``_swap_quiescent``)."""
    if not _others(writer):
        return
    current, recorded = writer.root.schema()
    if current is not None and schema != current:
        raise SchemaError(
            f"{writer.path} has other writers' segments; their schema cannot be changed by "
            "replacing this one's contents (load into a buffer of its own)"
        )
    if recorded and layouts and recorded != layouts:
        changed = sorted(k for k in recorded if recorded[k] != layouts.get(k))
        raise SchemaError(
            f"{writer.path} has other writers' segments, stored in another layout than the "
            f"new contents (keys {changed}); their layout cannot be changed by replacing "
            "this one's contents (load into a buffer of its own)"
        )


def _swap(writer, intent: Intent) -> None:
    with writer.quiescent():  # samples reading rows from disk finish first
        _swap_quiescent(writer, intent)


def _swap_quiescent(writer, intent: Intent) -> None:
    st = writer.state
    emptied = st.cleared_commit(writer.source) if st.index.num_visible else None
    if emptied is not None:
        intent.commit.gen = max(intent.commit.gen, emptied.gen + 1)
    # Other rows under this segment's name: readers must not take them for the old ones.
    # Inserts go on being counted from the writer's (a load inserts nothing).
    intent.commit.contents, intent.commit.inserted = new_contents(), st.commit.inserted
    path = intent_path(writer.seg_dir)
    published = False
    try:
        # No other writer creates arrays in the recorded layout between the check and
        # the new layout's record (recovery.open_segment takes the same guard).
        with writer.root.schema_guard():
            try:
                _check_replaceable(writer, intent.schema, intent.layouts)
            except SchemaError:
                discard(writer.seg_dir)  # what was staged for it
                raise
            with writer.lock.fenced():  # no takeover lands in the swap (locally)
                path.backend.publish(path, intent.to_json(), writer.durable)  # no return
                published = True
                if emptied is not None:
                    write_commit(writer.seg_dir, emptied, durable=writer.durable)
                finish(writer.root, writer.seg_dir, intent, writer.durable)
        writer.reopen()
    except BaseException as e:
        if published:
            recover_after(writer, e)  # never left holding the old contents in memory
        raise


def recover_after(writer, error: BaseException) -> None:
    """A change failed past its point of no return (the next open finishes it): read the
    segment again; if that fails too, give the writer up (it must never commit its stale
    state) and unlock, so that reopening the buffer finishes the change."""
    try:
        writer.reopen()
    except BaseException as again:  # noqa: BLE001 - given up below
        writer.give_up(f"{type(again).__name__}: {again} (after {type(error).__name__})")
