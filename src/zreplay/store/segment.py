"""One writer's segment on disk: data arrays, the offsets array, trajectory columns.

Arrays are created with zarr-python (so their metadata is exactly what zarr writes) and
read and written through :class:`~zreplay.store.arrays.ArrayHandle`, i.e. through
whatever the backend opens them with (TensorStore locally: zarr-python's per-call overhead
must never sit on the sampling path, and TensorStore writes shards about 10x faster).
Nothing here knows about sampling.

Row numbers are global within a segment and never reused; capacity grows ahead of need
and rows at or past the commit's ``n_rows`` are garbage.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import zarr

from ..errors import CorruptBufferError
from ..schema import KeySpec, Schema
from .arrays import ArrayHandle
from .commit import Commit, read_commit
from .format import INDEX_CHUNK, PIECE_COLUMNS, STORED_ATTRS, TRAJ_COLUMNS
from .layout import KeyLayout
from .location import Location, locate


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
    ):
        self.dir = locate(seg_dir)
        self.backend = self.dir.backend
        self.writer_id = self.dir.name
        self.schema = schema
        self.layouts = dict(layouts)
        self.writable = writable
        self._context = self.backend.array_context(durable)
        # Data arrays may share a cache of decoded chunks (readers only; see
        # Backend.array_context); index arrays are read whole and never need one.
        data_ctx = self._context
        if chunk_cache_bytes > 0:
            data_ctx = self.backend.array_context(durable, chunk_cache_bytes)
        self.data = {k: ArrayHandle(self.dir / "data" / k, data_ctx, writable) for k in schema.keys}
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

    def write_rows(self, key: str, start: int, rows: np.ndarray):
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
        """Delete shard files holding only rows in [start_row, end_row) (evicted rows),
        with the chunk-key directories they leave empty."""
        for key, lay in self.layouts.items():
            first = -(-start_row // lay.shard_rows)
            last = end_row // lay.shard_rows
            nd = 1 + len(self.schema.specs[key].row_shape)
            chunks = self.dir / "data" / key / "c"
            for s in range(first, last):
                p = chunks / str(s)
                for _ in range(nd - 1):
                    p = p / "0"
                self.backend.remove_file(p, chunks)

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
                        self.backend.remove_tree(p)

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
        except Exception as e:  # TensorStore reports corruption as ValueError
            raise CorruptBufferError(
                f"segment {self._segment.writer_id!r}, key {self._key!r}, rows "
                f"[{self._first}, {self._stop}): stored data is damaged or missing ({e}). "
                f"Run zreplay.verify({str(self._segment.dir.parent.parent)!r}) for a full "
                "report; restore the buffer from a checkpoint"
            ) from None
