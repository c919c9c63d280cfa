"""One writer's segment on disk: data arrays, the offsets array, trajectory columns.

Arrays are created with zarr-python (so their metadata is exactly what zarr writes) and
read and written through TensorStore over the same files: zarr-python's per-call overhead
(35-250 ms for 256 random rows, measured) must never sit on the sampling path, and
TensorStore writes shards about 10x faster.  Nothing here knows about sampling.

Row numbers are global within a segment and never reused; capacity grows ahead of need
and rows at or past the commit's ``n_rows`` are garbage.
"""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Mapping

import numpy as np
import tensorstore as ts
import zarr

from ..episodes import PIECE_COLUMNS
from ..errors import CorruptBufferError, ZReplayError
from ..schema import KeySpec, Schema
from .commit import Commit, read_commit
from .layout import KeyLayout
from .location import Location, RemotePath, location, remove_tree, zarr_store
from .zarrio import ZarrArray, forked

WEIGHTS_ID_BYTES = 64
INDEX_CHUNK = 4096

# Per-trajectory columns: name -> (dtype, row shape).
TRAJ_COLUMNS: dict[str, tuple[str, tuple[int, ...]]] = {
    "trajectory_id": ("int64", ()),
    "T": ("int64", ()),
    "B": ("int64", ()),
    "max_episode_length": ("int64", ()),
    "model_weights_id": ("uint8", (WEIGHTS_ID_BYTES,)),
    "piece_end": ("int64", ()),  # episode pieces [piece_end[i-1], piece_end[i]) are its
}


# Array attribute of arrays whose every written chunk is stored (see ArrayHandle._open).
STORED_ATTRS = {"zreplay": {"all_chunks_stored": True}}


def _all_chunks_stored(array_dir: Location) -> bool:
    try:
        meta = json.loads((array_dir / "zarr.json").read_bytes())
        return meta["attributes"]["zreplay"]["all_chunks_stored"] is True
    except (OSError, ValueError, KeyError, TypeError):
        return False  # opening reports a missing or damaged zarr.json


def _grow(current: int, needed: int, unit: int) -> int:
    """Next capacity >= needed: at least double, rounded up to a whole number of units."""
    target = max(needed, 2 * current, unit)
    return -(-target // unit) * unit


_WARNED_FORK = False


def io_context(durable: bool) -> ts.Context:
    """TensorStore context of a segment's arrays: no decoded-chunk cache (the RAM tier is
    ours); data files fsync'd only if ``durable``."""
    return ts.Context({"cache_pool": {"total_bytes_limit": 0}, "file_io_sync": bool(durable)})


class ArrayHandle:
    """A TensorStore handle on one Zarr array that can follow the array's growth."""

    def __init__(self, path: Location, context: ts.Context, writable: bool):
        self.path = path
        self._context = context
        self._writable = writable
        self._lock = threading.Lock()
        # zarr-python (forked readers, object stores) reads a missing chunk as fill values,
        # and so does TensorStore on arrays older than STORED_ATTRS; otherwise it is an error.
        self.fills_missing = True
        self.store = self._open()

    def _open(self) -> ts.TensorStore:
        if forked():
            self._check_forked()
        if forked() or isinstance(self.path, RemotePath):
            try:
                return ZarrArray(self.path, self._writable)
            except Exception as e:  # noqa: BLE001 - zarr/fsspec raise many kinds
                raise CorruptBufferError(f"cannot open array {self.path}: {e}") from None
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(self.path) + "/"}}
        # Every chunk is stored, zeros included, so a chunk missing below the commit is
        # damage (a read error), not rows of zeros.  Arrays made before this was so lack
        # the attribute and keep zarr's fill-value reads.
        self.fills_missing = not _all_chunks_stored(self.path)
        spec["store_data_equal_to_fill_value"] = True
        spec["fill_missing_data_reads"] = self.fills_missing
        try:
            return ts.open(spec, read=True, write=self._writable, context=self._context).result()
        except Exception as e:  # TensorStore raises ValueError/OSError variants
            raise CorruptBufferError(f"cannot open array {self.path}: {e}") from None

    def _check_forked(self) -> None:
        global _WARNED_FORK
        if self._writable:
            raise ZReplayError(
                "a buffer cannot be written from a forked child process (TensorStore does "
                "not survive fork); start writer processes with the 'spawn' or "
                "'forkserver' multiprocessing context"
            )
        if not _WARNED_FORK:
            _WARNED_FORK = True
            warnings.warn(
                "zreplay: reading in a forked process through zarr-python (slower); pass "
                "multiprocessing_context='spawn' or 'forkserver' to DataLoader for "
                "TensorStore-speed reads in workers",
                stacklevel=4,
            )

    @property
    def rows(self) -> int:
        return int(self.store.shape[0])

    def reopen_if_short(self, rows_needed: int) -> ts.TensorStore:
        """Return a handle covering ``rows_needed`` rows (another handle may have grown it)."""
        store = self.store
        if rows_needed > store.shape[0]:
            with self._lock:
                if rows_needed > self.store.shape[0]:
                    self.store = self._open()
                store = self.store
        return store

    def grow_to(self, rows_needed: int, unit: int) -> None:
        """Writer only: grow capacity (metadata only) so ``rows_needed`` rows fit."""
        if rows_needed <= self.rows:
            return
        new = _grow(self.rows, rows_needed, unit)
        shape = list(self.store.shape)
        shape[0] = new
        with self._lock:
            self.store = self.store.resize(
                exclusive_max=shape, resize_metadata_only=True, expand_only=True
            ).result()


class Segment:
    """Arrays of one segment ``segments/<writer_id>/`` of a buffer root."""

    def __init__(
        self,
        seg_dir: Location,
        schema: Schema,
        layouts: Mapping[str, KeyLayout],
        writable: bool,
        durable: bool = True,
    ):
        self.dir = location(seg_dir)
        self.writer_id = self.dir.name
        self.schema = schema
        self.layouts = dict(layouts)
        self.writable = writable
        self._context = io_context(durable)
        self.data = {
            k: ArrayHandle(self.dir / "data" / k, self._context, writable) for k in schema.keys
        }
        self.offsets = ArrayHandle(self.dir / "offsets", self._context, writable)
        self.traj = {
            c: ArrayHandle(self.dir / "traj" / c, self._context, writable) for c in TRAJ_COLUMNS
        }
        self.pieces = {
            c: ArrayHandle(self.dir / "episodes" / c, self._context, writable)
            for c in PIECE_COLUMNS
        }

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
        seg_dir = location(seg_dir)
        return [n for n in names if not (seg_dir / n / "zarr.json").is_file()]

    @staticmethod
    def create_arrays(seg_dir: Location, specs: Mapping[str, KeySpec], layouts: Mapping) -> None:
        """Create (or complete) the arrays of a segment with zarr-python."""
        seg_dir = location(seg_dir)
        if not Segment.missing_arrays(seg_dir, specs):
            return  # the common reopen: skip zarr-python's per-node round trips
        g = zarr.open_group(zarr_store(seg_dir), mode="a", zarr_format=3)
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
                shape=(lay.shard_rows, *spec.row_shape),
                dtype=spec.dtype,
                chunks=(lay.chunk_rows, *spec.row_shape),
                shards=(lay.shard_rows, *spec.row_shape),
                fill_value=0,
                config={"write_empty_chunks": True},
                attributes=STORED_ATTRS,
                **lay.zarr_codecs(spec.dtype),
            )
        if "offsets" not in g:
            g.create_array(
                "offsets",
                shape=(INDEX_CHUNK,),
                dtype="int64",
                chunks=(INDEX_CHUNK,),
                fill_value=0,
                config={"write_empty_chunks": True},
                attributes=STORED_ATTRS,
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
                )

    # -- writes (the segment's writer only) -----------------------------------------

    def ensure_capacity(self, n_rows: int, n_traj: int, n_pieces: int) -> None:
        for k, h in self.data.items():
            h.grow_to(n_rows, self.layouts[k].shard_rows)
        self.offsets.grow_to(n_traj + 1, INDEX_CHUNK)
        for h in self.traj.values():
            h.grow_to(n_traj, INDEX_CHUNK)
        for h in self.pieces.values():
            h.grow_to(n_pieces, INDEX_CHUNK)

    def write_rows(self, key: str, start: int, rows: np.ndarray) -> ts.WriteFutures:
        return self.data[key].store[start : start + len(rows)].write(rows)

    def write_index(
        self,
        first_traj: int,
        offsets_tail: np.ndarray,
        columns: Mapping[str, np.ndarray],
        first_piece: int,
        pieces: Mapping[str, np.ndarray],
    ) -> list:
        """Write offsets[first_traj+1 : ...], trajectory columns from ``first_traj`` and
        episode pieces from ``first_piece``."""
        n = len(offsets_tail)
        futs = [self.offsets.store[first_traj + 1 : first_traj + 1 + n].write(offsets_tail)]
        for name, col in columns.items():
            futs.append(self.traj[name].store[first_traj : first_traj + n].write(col))
        k = len(pieces["start"])
        if k:
            for name, col in pieces.items():
                futs.append(self.pieces[name].store[first_piece : first_piece + k].write(col))
        return futs

    def reclaim_below(self, start_row: int, end_row: int) -> None:
        """Delete shard files holding only rows in [start_row, end_row) (evicted rows)."""
        for key, lay in self.layouts.items():
            first = -(-start_row // lay.shard_rows)
            last = end_row // lay.shard_rows
            nd = 1 + len(self.schema.specs[key].row_shape)
            for s in range(first, last):
                p = self.dir / "data" / key / "c" / str(s)
                for _ in range(nd - 1):
                    p = p / "0"
                p.unlink(missing_ok=True)

    def remove_reclaimed(self, below_row: int) -> None:
        """Delete every shard file wholly below ``below_row`` that is still there (a writer
        killed while reclaiming leaves some; the commit already says they are gone)."""
        for key, lay in self.layouts.items():
            limit = below_row // lay.shard_rows
            chunks = self.dir / "data" / key / "c"
            try:
                found = list(chunks.iterdir())
            except FileNotFoundError:
                continue
            for p in found:
                if p.name.isdigit() and int(p.name) < limit:
                    if p.is_file():
                        p.unlink(missing_ok=True)
                    else:
                        remove_tree(p)

    # -- reads ----------------------------------------------------------------------

    def read_index(self, commit: Commit) -> dict[str, np.ndarray]:
        """Offsets ``[n_traj+1]`` and trajectory columns ``[n_traj]`` up to the commit."""
        n, k = commit.n_traj, commit.n_pieces
        if n == 0:
            out = {"offsets": np.zeros(1, np.int64)}
            for name, (dtype, row) in TRAJ_COLUMNS.items():
                out[name] = np.zeros((0, *row), dtype)
            out["pieces"] = {c: np.zeros(0, d) for c, d in PIECE_COLUMNS.items()}
            return out
        futs = {"offsets": self.offsets.reopen_if_short(n + 1)[: n + 1].read()}
        for name, h in self.traj.items():
            futs[name] = h.reopen_if_short(n)[:n].read()
        pfuts = {c: h.reopen_if_short(k)[:k].read() for c, h in self.pieces.items()}
        try:
            out = {name: f.result() for name, f in futs.items()}
            out["pieces"] = {c: f.result() for c, f in pfuts.items()}
        except Exception as e:  # TensorStore reports damage as ValueError
            raise CorruptBufferError(f"{self.dir}: the index cannot be read ({e})") from None
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
        return out

    def read_rows(self, key: str, rows: np.ndarray) -> PendingRead:
        """Start reading sorted unique ``rows`` of ``key``."""
        store = self.data[key].reopen_if_short(int(rows[-1]) + 1)
        return PendingRead(store[rows].read(), self, key, int(rows[0]), int(rows[-1]) + 1)

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
        except Exception as e:  # TensorStore reports corruption as ValueError
            raise CorruptBufferError(
                f"segment {self._segment.writer_id!r}, key {self._key!r}, rows "
                f"[{self._first}, {self._stop}): stored data is damaged or missing ({e}). "
                f"Run zreplay.verify({str(self._segment.dir.parent.parent)!r}) for a full "
                "report; restore the buffer from a checkpoint"
            ) from None
