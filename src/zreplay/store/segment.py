"""One writer's segment on disk: data arrays, the offsets array, trajectory columns.

Arrays are created with zarr-python (so their metadata is exactly what zarr writes) and
read and written through :class:`~zreplay.store.arrays.ArrayHandle`, i.e. through
whatever the backend opens them with (TensorStore locally: zarr-python's per-call overhead
must never sit on the sampling path, and TensorStore writes shards about 10x faster).
Nothing here knows about sampling.

Row numbers are global within a segment and never reused.  Each data array is exactly as
long as the last commit needs (its ``zarr.json`` is rewritten before every commit: see
:meth:`Segment.set_lengths`); index arrays grow ahead; rows and entries at or past the
commit's counts are garbage.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from ..errors import CorruptBufferError, MissingCodecError
from ..schema import KeySpec, Schema
from .arrays import ArrayHandle
from .commit import Commit, read_commit
from .format import (
    CHUNK_KEY_SEPARATOR,
    INDEX_CHUNK,
    LIVE_ROWS_ATTR,
    META,
    PIECE_COLUMNS,
    PRIORITY_GROUP,
    STORED_ATTRS,
    TRAJ_COLUMNS,
    commit_path,
)
from .layout import KeyLayout, chunk_key_separator, shard_key, shard_number
from .location import Location, locate
from .memory import physical_memory

# A shard file's name in its array's directory, either separator (not a temporary).
_SHARD_FILE = re.compile(r"c(?:[./][0-9]+)+")


def _grow(current: int, needed: int) -> int:
    """An index array's next length >= needed: at least double, in whole chunks."""
    target = max(needed, 2 * current, INDEX_CHUNK)
    return -(-target // INDEX_CHUNK) * INDEX_CHUNK


class Segment:
    """Arrays of one segment ``segments/<writer_id>/`` of a buffer root."""

    def __init__(
        self,
        seg_dir: Location,
        schema: Schema,
        layouts: Mapping[str, KeyLayout],
        writable: bool,
        durable: bool = True,
        chunk_cache_bytes: int = 0,
        chunk_cache_keys: frozenset | None = None,
    ):
        self.dir = locate(seg_dir)
        self.backend = self.dir.backend
        self.writer_id = self.dir.name
        self.schema = schema
        self.layouts = dict(layouts)
        self.writable = writable
        self._context = self.backend.array_context(durable)
        # Data arrays of ``chunk_cache_keys`` (None: all) may share a cache of decoded
        # chunks (readers only; see Backend.array_context); index arrays are read whole
        # and never need one.
        cached = self._data_context = self._context
        if chunk_cache_bytes > 0:
            cached = self._data_context = self.backend.array_context(durable, chunk_cache_bytes)

        def handle(rel: str, dtype, row, ctx=self._context) -> ArrayHandle:
            return ArrayHandle(self.dir / rel, ctx, writable, (dtype, row))

        self.data = {
            k: handle(
                f"data/{k}",
                s.dtype,
                s.row_shape,
                cached if chunk_cache_keys is None or k in chunk_cache_keys else self._context,
            )
            for k, s in schema.specs.items()
        }
        self.offsets = handle("offsets", "int64", ())
        self.traj = {c: handle(f"traj/{c}", d, r) for c, (d, r) in TRAJ_COLUMNS.items()}
        self.pieces = {c: handle(f"episodes/{c}", d, ()) for c, d in PIECE_COLUMNS.items()}
        # Every array is written, resized and deleted (clear, reclaim) at its path: none
        # may resolve outside the buffer (segments/<w>/ sits two levels below the root).
        root = self.dir.parent.parent
        for h in [*self.data.values(), self.offsets, *self.traj.values(), *self.pieces.values()]:
            self.backend.confine(root, h.path)
        for name in (PRIORITY_GROUP, META):
            self.backend.confine(root, self.dir / name)
        self._files_checked = False  # every array's files are regular files (read_index)
        self._separators: dict[str, str] = {}  # data arrays' chunk-key separators read
        self._live: list[int] | None = None  # the live_rows attribute written last
        # (n_rows, n_traj, last trajectory id, contents id) of the commit read last
        self._seen: tuple[int, int, int, str] | None = None

    @property
    def fills_missing(self) -> bool:
        """A missing data chunk may read as fill values instead of failing."""
        return any(h.fills_missing for h in self.data.values())

    # -- creation -------------------------------------------------------------------

    @staticmethod
    def missing_arrays(seg_dir: Location, specs: Mapping[str, KeySpec]) -> list[str]:
        """Arrays of the segment that have no metadata on disk."""
        names = [f"data/{k}" for k in specs] + ["offsets"] + [f"traj/{c}" for c in TRAJ_COLUMNS]
        names += [f"episodes/{c}" for c in PIECE_COLUMNS]
        seg_dir = locate(seg_dir)
        return [n for n in names if not (seg_dir / n / "zarr.json").is_file()]

    @staticmethod
    def create_arrays(seg_dir: Location, specs: Mapping[str, KeySpec], layouts: Mapping) -> None:
        """Create (or complete) the arrays of a segment with zarr-python."""
        seg_dir = locate(seg_dir)
        if not Segment.missing_arrays(seg_dir, specs):
            return  # the common reopen: skip zarr-python's per-node round trips
        g = zarr.open_group(seg_dir.backend.zarr_store(seg_dir), mode="a", zarr_format=3)
        data = g.require_group("data")
        for path, spec in specs.items():
            lay = layouts[path]
            *parents, leaf = path.split("/")
            grp = data
            for p in parents:
                grp = grp.require_group(p)
            if leaf in grp:
                continue
            grp.create_array(
                leaf,
                shape=(0, *spec.row_shape),
                dtype=spec.dtype,
                chunks=(lay.chunk_rows, *spec.row_shape),
                shards=(lay.shard_rows, *spec.row_shape),
                chunk_key_encoding={"name": "default", "separator": CHUNK_KEY_SEPARATOR},
                fill_value=0,
                config={"write_empty_chunks": True},
                attributes=STORED_ATTRS,
                **lay.zarr_codecs(spec.dtype),
            )
        # Index chunks are checksummed like data chunks: a flipped bit in an offset, an
        # id or a terminated flag is an error, never a silently different trajectory.
        index_codecs = {"compressors": [ZstdCodec(level=1), Crc32cCodec()]}
        if "offsets" not in g:
            g.create_array(
                "offsets",
                shape=(INDEX_CHUNK,),
                dtype="int64",
                chunks=(INDEX_CHUNK,),
                fill_value=0,
                config={"write_empty_chunks": True},
                attributes=STORED_ATTRS,
                **index_codecs,
            )
        columns = [("traj", n, d, r) for n, (d, r) in TRAJ_COLUMNS.items()]
        columns += [("episodes", n, d, ()) for n, d in PIECE_COLUMNS.items()]
        for group, name, dtype, row in columns:
            grp = g.require_group(group)
            if name not in grp:
                grp.create_array(
                    name,
                    shape=(INDEX_CHUNK, *row),
                    dtype=dtype,
                    chunks=(INDEX_CHUNK, *row),
                    fill_value=0 if dtype != "bool" else False,
                    config={"write_empty_chunks": True},
                    attributes=STORED_ATTRS,
                    **index_codecs,
                )

    # -- writes (the segment's writer only) -----------------------------------------

    def set_lengths(self, n_rows: int, n_traj: int, n_pieces: int) -> None:
        """Make every data array exactly ``n_rows`` long, and the index arrays at least
        as long as the counts need (grown ahead, doubling: zreplay's own bookkeeping),
        all at once, metadata only.  Done before a commit's rows are written, so they
        fit, and when a writer reopens a segment that a killed commit left longer: plain
        zarr shows a data array's committed rows (and at most a commit in flight), never
        padding; zreplay's readers go by the commit record only."""
        pending = [(h, h.start_resize(n_rows)) for h in self.data.values()]
        index = [(self.offsets, n_traj + 1)]
        index += [(h, n_traj) for h in self.traj.values()]
        index += [(h, n_pieces) for h in self.pieces.values()]
        pending += [(h, h.start_resize(_grow(h.rows, need))) for h, need in index if need > h.rows]
        failed = None
        for h, p in pending:  # every handle follows its array, whichever resize failed
            try:
                if p is not None:
                    h.finish_resize(p)
            except Exception as e:  # noqa: BLE001 - the first is raised below
                failed = failed or e
        if failed is not None:
            raise failed

    def publish_live_rows(self, low_row: int, n_rows: int, durable: bool) -> None:
        """Say in the segment group's attributes which rows of the data arrays are live
        (``live_rows``: ``[low_row, n_rows]`` of the commit just published), for readers
        that speak only Zarr.  The group's attributes are zreplay's."""
        live = [int(low_row), int(n_rows)]
        if self._live is None:  # a reopen: what is there may be right already
            try:
                doc = json.loads((self.dir / "zarr.json").read_bytes())
                self._live = doc.get("attributes", {}).get(LIVE_ROWS_ATTR)
            except (OSError, ValueError, AttributeError):
                pass
        if live != self._live:
            doc = {"zarr_format": 3, "node_type": "group", "attributes": {LIVE_ROWS_ATTR: live}}
            self.backend.publish(self.dir / "zarr.json", json.dumps(doc).encode(), durable)
            self._live = live

    def write_rows(self, key: str, start: int, rows: np.ndarray):
        """Start writing ``rows`` at row ``start`` of ``key``; returns the write's future.
        ``rows`` must stay unchanged until it is done (the committer's rows are the RAM
        tier's, whose slots are reused only once their commit is published), so they are
        written without a copy where the backend can."""
        return self.data[key].write_held(start, rows)

    def write_index(
        self,
        first_traj: int,
        offsets_tail: np.ndarray,
        columns: Mapping[str, np.ndarray],
        first_piece: int,
        pieces: Mapping[str, np.ndarray],
    ) -> list:
        """Write ``offsets[first_traj : first_traj + len(offsets_tail)]`` (the first entry is
        already there unless ``first_traj`` is 0: the segment's first row), trajectory
        columns from ``first_traj`` and episode pieces from ``first_piece``."""
        n = len(offsets_tail) - 1
        futs = [self.offsets.store[first_traj : first_traj + 1 + n].write(offsets_tail)]
        for name, col in columns.items():
            futs.append(self.traj[name].store[first_traj : first_traj + n].write(col))
        k = len(pieces["start"])
        if k:
            for name, col in pieces.items():
                futs.append(self.pieces[name].store[first_piece : first_piece + k].write(col))
        return futs

    def reclaim_below(self, start_row: int, end_row: int) -> None:
        """Delete shard files holding only rows in [start_row, end_row) (evicted rows:
        ``start_row`` is the last reclaim's bound, below which every row is gone, so the
        shard holding it goes too once it is wholly below ``end_row``), with the
        chunk-key directories they leave empty."""
        for key, lay in self.layouts.items():
            first = start_row // lay.shard_rows
            last = end_row // lay.shard_rows
            for s in range(first, last):
                shard = self._shard_file(key, s)
                if shard is not None:
                    self.backend.confine(self.dir, shard)  # c/<s>/... nests (format 4)
                    self.backend.remove_file(shard, self.dir / "data" / key)

    def _separator(self, key: str) -> str | None:
        """The chunk-key separator of ``key``'s array, as its ``zarr.json`` says ("." since
        format 5, "/" before); None if that cannot be read (nothing is named then)."""
        sep = self._separators.get(key)
        if sep is None:
            try:
                meta = json.loads((self.dir / "data" / key / "zarr.json").read_bytes())
            except (OSError, ValueError):
                return None
            sep = chunk_key_separator(meta)
            if sep is not None:
                self._separators[key] = sep
        return sep

    def _shard_file(self, key: str, shard: int):
        """The file of shard ``shard`` (rows ``[shard * shard_rows, ...)``) of ``key``,
        or None if its array's chunk keys cannot be told."""
        sep = self._separator(key)
        if sep is None:
            return None
        ndim = 1 + len(self.schema.specs[key].row_shape)
        return self.dir / "data" / key / shard_key(sep, shard, ndim)

    def remove_reclaimed(self, below_row: int) -> None:
        """Delete every shard file wholly below ``below_row`` that is still there (a writer
        killed while reclaiming leaves some; the commit already says they are gone).
        Both forms are looked for: shard files ``c.<s>...`` in the array's directory and
        subtrees ``c/<s>/`` of its ``c/`` (an array made before format 5, or one a killed
        ``clear()`` left that was made again flat)."""
        for key, lay in self.layouts.items():
            limit = below_row // lay.shard_rows
            array = self.dir / "data" / key
            for top, prefix in ((array, ""), (array / "c", "c/")):
                try:
                    found = list(top.iterdir())
                except FileNotFoundError:
                    continue
                for p in found:
                    shard = shard_number(prefix + p.name)
                    if shard is not None and shard < limit:
                        self.backend.confine(self.dir, p)
                        if p.is_file():
                            p.unlink(missing_ok=True)
                        else:
                            self.backend.remove_tree(p)
                if prefix and len(found) and not any(True for _ in top.iterdir()):
                    self.backend.remove_tree(top)  # a c/ left empty

    # -- reads ----------------------------------------------------------------------

    def read_index(self, commit: Commit) -> dict[str, np.ndarray]:
        """Offsets ``[n_traj+1]`` and trajectory columns ``[n_traj]`` up to the commit."""
        n, k = commit.n_traj, commit.n_pieces
        if n == 0:  # rows continue where the segment (or a clear) left off
            out = {"offsets": np.full(1, commit.n_rows, np.int64)}
            for name, (dtype, row) in TRAJ_COLUMNS.items():
                out[name] = np.zeros((0, *row), dtype)
            out["pieces"] = {c: np.zeros(0, d) for c, d in PIECE_COLUMNS.items()}
            self._observe(commit, out["trajectory_id"])
            return out
        self._check_index_size(commit)
        if not self._files_checked:  # a FIFO TensorStore would block on: once per open
            for h in [
                *self.data.values(),
                self.offsets,
                *self.traj.values(),
                *self.pieces.values(),
            ]:
                self.backend.check_files(h.path)
            self._files_checked = True
        futs = {"offsets": self.offsets.reopen_if_short(n + 1)[: n + 1].read()}
        for name, h in self.traj.items():
            futs[name] = h.reopen_if_short(n)[:n].read()
        pfuts = {c: h.reopen_if_short(k)[:k].read() for c, h in self.pieces.items()}
        try:
            out = {name: f.result() for name, f in futs.items()}
            out["pieces"] = {c: f.result() for c, f in pfuts.items()}
        except Exception as e:  # TensorStore reports damage as ValueError
            raise CorruptBufferError(f"{self.dir}: the index cannot be read ({e})") from None
        self._observe(commit, out["trajectory_id"])
        off = out["offsets"]
        ends = out["piece_end"]
        if (
            off[-1] != commit.n_rows
            or np.any(np.diff(off[commit.low_traj :]) < 0)
            or ends[-1] != k
            or out["pieces"]["length"][commit.low_piece :].sum() != commit.n_rows - commit.low_row
        ):
            raise CorruptBufferError(
                f"{self.dir}: offsets or episode table disagree with commit.json (offsets end "
                f"at {off[-1]}, pieces at {ends[-1]}; commit says {commit.n_rows} rows, {k} "
                "pieces); the index is damaged"
            )
        problem = index_problem(out, commit)
        if problem:
            raise CorruptBufferError(
                f"{self.dir}: {problem}; the index is damaged",
                "Restore the segment from a checkpoint; zreplay.verify() reports all damage",
            )
        return out

    def _check_index_size(self, commit: Commit) -> None:
        """CorruptBufferError, naming the files, if the commit's counts need more index
        than the arrays hold or than this machine has memory: checked before anything is
        allocated (TensorStore aborts the process when an allocation fails)."""
        n, k = commit.n_traj, commit.n_pieces
        need = (n + 1) * 8 + n * _row_bytes(TRAJ_COLUMNS.values())
        need += k * _row_bytes((d, ()) for d in PIECE_COLUMNS.values())
        if need > physical_memory():
            raise CorruptBufferError(
                f"{commit_path(self.dir)}: the commit counts {n} trajectories and {k} episode "
                f"pieces, whose index needs {need / 2**30:.1f} GiB, more than this machine's "
                f"{physical_memory() / 2**30:.1f} GiB of memory; the commit record or the "
                "index arrays' zarr.json are damaged (restore from a checkpoint)"
            )
        for name, h, rows in [
            ("offsets", self.offsets, n + 1),
            *((f"traj/{c}", h, n) for c, h in self.traj.items()),
            *((f"episodes/{c}", h, k) for c, h in self.pieces.items()),
            *((f"data/{key}", h, commit.n_rows) for key, h in self.data.items()),
        ]:
            if h.reopen_if_short(rows).shape[0] < rows:
                raise CorruptBufferError(
                    f"{self.dir / name / 'zarr.json'}: the array has "
                    f"{h.store.shape[0]} rows but {commit_path(self.dir)} needs {rows}; "
                    "the segment is damaged (restore it from a checkpoint)"
                )

    def _observe(self, commit: Commit, ids: np.ndarray) -> None:
        """Tell the backend which rows are committed, and whether they continue the rows
        of the commit read before (a cleared or replaced segment starts its rows anew:
        its contents id changes; commits written before contents ids are compared by
        their last trajectory id)."""
        seen = self._seen
        if seen is None:
            same = True
        elif seen[3] and commit.contents:
            same = commit.contents == seen[3] and commit.n_rows >= seen[0]
        else:
            same = (
                commit.n_rows >= seen[0]
                and len(ids) >= seen[1]
                and (seen[1] == 0 or int(ids[seen[1] - 1]) == seen[2])
            )
        self._seen = (commit.n_rows, len(ids), int(ids[-1]) if len(ids) else -1, commit.contents)
        for ctx in {id(c): c for c in (self._context, self._data_context)}.values():
            self.backend.observe_commit(ctx, commit.n_rows, commit.reclaimed_below, same)

    def forget_pages(self, key: str, start: int, stop: int) -> None:
        """Rows ``[start, stop)`` of ``key`` were decoded into the column cache file: the
        shard files holding them need not stay in the page cache (which then keeps that
        file's pages instead)."""
        n = self.layouts[key].shard_rows
        files = [self._shard_file(key, s) for s in range(start // n, -(-stop // n))]
        self.backend.forget_pages([f for f in files if f is not None])

    def shard_stamps(self, key: str, start: int, stop: int) -> list[tuple[int, tuple | None]]:
        """``(first row, stamp)`` of every shard file of ``key`` holding rows of ``[start,
        stop)`` (see :meth:`Backend.file_stamps <zreplay.store.backend.Backend.file_stamps>`;
        None: missing or unknown): what a cache of those rows records when it reads them,
        and compares before it serves them again (a restored backup keeps row numbers
        and contents id, not its shard files' stamps)."""
        n = self.layouts[key].shard_rows
        shards = range(start // n, -(-stop // n))
        if not self.backend.is_local and stop < (start // n + 1) * n:
            # Rows of one shard not yet complete (a fill after a small commit): no listing
            # on the sampling path; its rows are read again by the next process anyway
            # (every commit rewrites that shard).
            return [(start // n * n, None)]
        listed = self.backend.tree_stamps(self.dir / "data" / key)
        if listed is not None:  # (no zarr.json read for the chunk-key separator)
            by = {shard_number(r): st for r, st in listed.items() if _SHARD_FILE.fullmatch(r)}
            return [(s * n, by.get(s)) for s in shards]
        files = [self._shard_file(key, s) for s in shards]
        found = self.backend.file_stamps([f for f in files if f is not None])
        stamps = iter(found)
        return [
            (s * n, None if f is None else next(stamps)) for s, f in zip(shards, files, strict=True)
        ]

    def read_points(self, key: str, rows: np.ndarray) -> PendingRead:
        """Start reading ``rows`` of ``key`` (int64, any order, repeats allowed): the
        result holds them in that order."""
        lo, hi = int(rows.min()), int(rows.max()) + 1
        store = self.data[key].reopen_if_short(hi)
        return PendingRead(store[rows].read(), self, key, lo, hi)

    def read_range(self, key: str, start: int, stop: int) -> PendingRead:
        """Start reading rows ``[start, stop)`` of ``key``."""
        store = self.data[key].reopen_if_short(stop)
        return PendingRead(store[start:stop].read(), self, key, start, stop)

    def commit(self) -> Commit | None:
        return read_commit(self.dir)


class PendingRead:
    """A read in flight; ``result()`` turns a decode/checksum/I-O failure into a
    CorruptBufferError naming the segment, key and rows."""

    def __init__(self, future, segment: Segment, key: str, first: int, stop: int):
        self._future, self._segment, self._key = future, segment, key
        self._first, self._stop = first, stop

    def result(self) -> np.ndarray:
        try:
            return self._future.result()
        except MissingCodecError:
            raise  # a codec this Python lacks: the rows may be fine
        except Exception as e:  # TensorStore reports corruption as ValueError
            raise CorruptBufferError(
                f"segment {self._segment.writer_id!r}, key {self._key!r}, rows "
                f"[{self._first}, {self._stop}): stored data is damaged or missing ({e})",
                f"Run zreplay.verify({str(self._segment.dir.parent.parent)!r}) for a full "
                "report; restore the buffer from a checkpoint",
            ) from None


def index_problem(cols: dict, commit: Commit) -> str | None:
    """What in a segment's index (as :meth:`Segment.read_index` read it) disagrees with
    itself or with ``commit`` over the visible trajectories and pieces, or None: every
    trajectory's rows are ``T * B``, the first visible one starts at ``low_row``, ids are
    unique and below the commit's next ids, and every piece lies inside its trajectory."""
    lo, n, k0 = commit.low_traj, commit.n_traj, commit.low_piece
    off = cols["offsets"]
    # With no visible trajectory, low_row is where the rows end: off[n] (== n_rows).
    if int(off[lo]) != commit.low_row:
        return f"the first visible trajectory starts at row {int(off[lo])}, not {commit.low_row}"
    if lo == n:
        return None
    sizes = cols["T"][lo:n] * cols["B"][lo:n]
    bad = np.flatnonzero(np.diff(off[lo : n + 1]) != sizes)
    if len(bad):
        return f"trajectory {lo + int(bad[0])} holds other than T * B rows"
    ids = np.sort(cols["trajectory_id"][lo:n])  # (np.unique would import numpy.ma: 8 ms)
    if int(ids[-1]) >= commit.next_trajectory_id or bool(np.any(ids[1:] == ids[:-1])):
        return "trajectory ids repeat, or reach the commit's next id"
    pieces, ends = cols["pieces"], cols["piece_end"]
    k = int(ends[n - 1])
    if k > k0:
        if int(pieces["episode"][k0:k].max()) >= commit.next_episode:
            return "episode ids reach the commit's next episode id"
        if lo and int(ends[lo - 1]) > k0:  # pieces of a trajectory that is not visible
            return "an episode piece lies outside its trajectory's rows"
        # Each piece's trajectory: trajectory t holds pieces [ends[t - 1], ends[t]).
        cut = np.clip(ends[lo:n], k0, k)
        j = np.repeat(np.arange(lo, n), np.diff(cut, prepend=k0))
        start, length = pieces["start"][k0:k], pieces["length"][k0:k]
        if np.any(start < off[j]) or np.any(start + length > off[j + 1]):
            return "an episode piece lies outside its trajectory's rows"
    return None


def _row_bytes(columns) -> int:
    return sum(np.dtype(d).itemsize * int(np.prod(r, dtype=np.int64)) for d, r in columns)
