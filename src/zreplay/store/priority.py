"""Persisted priorities: two float64 arrays over a segment's row axis, written in turn.

``segments/<writer_id>/priority/0`` and ``.../priority/1`` each hold one tree leaf per
global row (``leaf[r]`` at index ``r``).  The commit record names the copy that is valid
(``commit.sampler["priority"] = {"slot", "seq", "low", "high", ...}``) and the rows it
covers; a writer only ever writes the *other* copy and then publishes a commit naming it,
so a crash in the middle of a write leaves the named copy intact (shadow paging).  Rows
outside the named range, and the whole copy the commit does not name, are garbage: a
save never reads the copy it writes (it is removed and written afresh, metadata and
all), so a copy a power cut truncated costs nothing.  Files are replaced atomically
(temp file + rename) like every other file, so hard-linked checkpoints keep their
bytes.  Nothing here knows what a leaf means.
"""

from __future__ import annotations

import json

import numpy as np

from ..errors import CorruptBufferError, EmptyBufferError
from .arrays import ArrayHandle
from .commit import INT64_MAX, Commit, read_commit
from .format import PRIORITY_CHUNK_ROWS, PRIORITY_GROUP, PRIORITY_SLOTS, commit_path
from .location import Location, locate

_RETRIES = 5

_GROUP_JSON = json.dumps({"attributes": {}, "zarr_format": 3, "node_type": "group"}).encode()


def _array_json(rows: int) -> bytes:
    """``zarr.json`` of a priority copy of ``rows`` rows (what zarr-python writes)."""
    meta = json.loads(_ARRAY_JSON)
    meta["shape"] = [int(rows)]
    return json.dumps(meta).encode()


_ARRAY_JSON = json.dumps(
    {
        "shape": [PRIORITY_CHUNK_ROWS],
        "data_type": "float64",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [PRIORITY_CHUNK_ROWS]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0.0,
        "codecs": [
            {"name": "bytes", "configuration": {"endian": "little"}},
            {"name": "zstd", "configuration": {"level": 1, "checksum": False}},
            {"name": "crc32c"},
        ],
        "attributes": {},
        "zarr_format": 3,
        "node_type": "array",
        "storage_transformers": [],
    }
).encode()


def slot_path(seg_dir: Location, slot: int) -> Location:
    return locate(seg_dir) / PRIORITY_GROUP / str(int(slot))


def next_copy(named: dict | None) -> tuple[int, int]:
    """``(slot, seq)`` of the next save: the copy the commit does *not* name."""
    if not named:
        return 0, 1
    return 1 - int(named["slot"]), int(named["seq"]) + 1


class PriorityArrays:
    """The two priority copies of one segment (created on the first write)."""

    def __init__(self, seg_dir: str | Location, writable: bool, durable: bool = True):
        self.dir = locate(seg_dir)
        self.writable = writable
        self._context = self.dir.backend.array_context(durable)
        self._durable = durable
        self._handles: dict[int, ArrayHandle] = {}
        self._group_made = False

    def _ensure_group(self) -> None:
        """The ``priority`` group's ``zarr.json`` (written directly, exactly what
        zarr-python writes; a test compares), so a save needs no zarr-python, whose
        thread pool is gone when buffers are closed at exit."""
        group = self.dir / PRIORITY_GROUP
        if not self._group_made:
            group.mkdir(parents=True, exist_ok=True)
            self.dir.backend.create_exclusive(group / "zarr.json", _GROUP_JSON)
            self._group_made = True

    def _handle(self, slot: int) -> ArrayHandle:
        h = self._handles.get(slot)
        if h is None:
            h = self._handles[slot] = ArrayHandle(
                slot_path(self.dir, slot), self._context, self.writable
            )
        return h

    def write(self, slot: int, start: int, leaves: np.ndarray) -> None:
        """Make copy ``slot`` hold ``leaves: float64[k]`` at rows ``[start, start + k)``
        and nothing else: the copy is removed and written afresh (its zarr.json sized to
        the rows, whole chunks only), so nothing it held before is ever read, whatever
        state a crash or a power cut left it in.  Never call it on the copy the current
        commit names."""
        path = slot_path(self.dir, slot)
        backend = self.dir.backend
        self._handles.pop(slot, None)
        self._ensure_group()
        if path.is_file():  # whatever is there is garbage, a file in its place too
            path.unlink(missing_ok=True)
        backend.remove_tree(path)
        stop = start + len(leaves)
        rows = max(1, -(-stop // PRIORITY_CHUNK_ROWS)) * PRIORITY_CHUNK_ROWS
        path.mkdir(parents=True, exist_ok=True)
        backend.publish(path / "zarr.json", _array_json(rows), durable=self._durable)
        if not len(leaves):
            return
        # Pad to whole chunks: a write covering a chunk entirely never reads it back.
        lo = start // PRIORITY_CHUNK_ROWS * PRIORITY_CHUNK_ROWS
        padded = np.zeros(rows - lo, np.float64)
        padded[start - lo : stop - lo] = leaves
        h = self._handles[slot] = ArrayHandle(path, self._context, self.writable)
        h.store[lo:rows].write(padded).result()

    def read(self, slot: int, start: int, stop: int) -> np.ndarray:
        """Leaves ``float64[stop - start]`` of rows ``[start, stop)`` of copy ``slot``."""
        if stop <= start:
            return np.zeros(0, np.float64)
        missing = self._missing_chunks(slot, start, stop)
        if missing:  # a missing chunk reads as zeros: priority 0, never drawn; damage
            raise CorruptBufferError(
                f"{self.dir}: priorities of rows [{start}, {stop}) (copy {slot}) cannot be "
                f"read: chunk files {missing[:3]} are missing"
            )
        try:
            store = self._handle(slot).reopen_if_short(stop)
            return np.asarray(store[start:stop].read().result(), np.float64)
        except Exception as e:  # TensorStore/zarr report damage and absence variously
            raise CorruptBufferError(
                f"{self.dir}: priorities of rows [{start}, {stop}) (copy {slot}) cannot be "
                f"read ({e})"
            ) from None

    def _missing_chunks(self, slot: int, start: int, stop: int) -> list[int]:
        """Chunks of rows ``[start, stop)`` without a file (every save writes them all)."""
        chunks = slot_path(self.dir, slot) / "c"
        have = {int(rel) for rel, _ in chunks.backend.walk_files(chunks) if rel.isdigit()}
        first, last = start // PRIORITY_CHUNK_ROWS, (stop - 1) // PRIORITY_CHUNK_ROWS
        return [c for c in range(first, last + 1) if c not in have]

    def damage(self, slot: int) -> str | None:
        """What is damaged in copy ``slot`` (its metadata, or a stored chunk that does not
        decode), or None (also for a copy never written)."""
        path = slot_path(self.dir, slot)
        if path.is_file():
            return "a file stands where the copy's directory belongs"
        if not (path / "zarr.json").exists():
            return None
        try:
            store = self._handle(slot).store
            chunks = sorted(
                int(rel.rsplit("/", 1)[-1])
                for rel, _ in path.backend.walk_files(path / "c")
                if rel.rsplit("/", 1)[-1].isdigit()
            )
            for c in chunks:
                a = c * PRIORITY_CHUNK_ROWS
                b = min(a + PRIORITY_CHUNK_ROWS, int(store.shape[0]))
                if b > a:
                    store[a:b].read().result()
        except Exception as e:  # noqa: BLE001 - TensorStore/zarr report damage variously
            self._handles.pop(slot, None)
            return f"{type(e).__name__}: {e}"
        return None


def priority_record(commit: Commit, where) -> dict | None:
    """``commit.sampler["priority"]`` (None if absent), its numbers checked against what
    the segment holds: a sampler allocates a tree of ``capacity`` leaves, so a crafted
    one must not ask for more than the commit's rows can need (a tree never grows past
    twice the rows it holds, nor starts below :data:`PRIORITY_CHUNK_ROWS`)."""
    meta = (commit.sampler or {}).get("priority")
    if not meta:
        return None
    problem = _record_problem(meta, commit)
    if problem:
        raise CorruptBufferError(
            f"{where}: the saved priorities' record {problem}; the commit record is damaged "
            "(restore the segment from a checkpoint; zreplay.verify() reports all damage)"
        )
    return meta


def _record_problem(meta, commit: Commit) -> str | None:
    if not isinstance(meta, dict):
        return f"is {type(meta).__name__}, not an object"

    def whole(name: str, lo: int, hi: int) -> bool:
        v = meta.get(name)
        return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi

    def real(name: str) -> bool:
        v = meta.get(name)
        return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)

    rows = commit.n_rows
    checks = {
        "slot": whole("slot", min(PRIORITY_SLOTS), max(PRIORITY_SLOTS)),
        "seq": whole("seq", 0, INT64_MAX),
        "low": whole("low", 0, INT64_MAX),
        "high": whole("high", 0, INT64_MAX) and meta.get("high", 0) >= meta.get("low", 0),
        "capacity": whole("capacity", 1, max(PRIORITY_CHUNK_ROWS, 2 * rows)),
        "max_priority": real("max_priority") and meta["max_priority"] >= 0,
        "alpha": real("alpha"),
        "eps": real("eps"),
    }
    bad = [f"{k}={meta.get(k)!r}" for k, ok in checks.items() if not ok]
    if not bad:
        return None
    return (
        f"holds {', '.join(bad)}, out of range for a segment of {rows} rows (capacity at "
        f"most {max(PRIORITY_CHUNK_ROWS, 2 * rows)} leaves)"
    )


def saved_priorities(seg_dir: Location, commit: Commit, arrays: PriorityArrays | None = None):
    """``(meta, read(lo, hi))`` of the priorities saved with ``commit`` (``None`` if none
    were saved, or, for the writer, if they cover none of its rows); ``meta["high"]`` is
    bounded by the commit's rows, and ``read`` returns float64 leaves of rows ``[lo, hi)``.

    Read from outside the writer (``arrays`` not given), the copy is re-checked against
    the segment's newest commit after each read: a writer rewrites the copy its commit
    does *not* name, so a copy read while the commit still names it (same ``seq`` before
    and after) is consistent; otherwise the read is retried on the newly named copy.
    """
    meta = priority_record(commit, commit_path(seg_dir))
    if not meta:
        return None
    bounded = {**meta, "high": min(meta["high"], commit.n_rows)}
    if arrays is not None:  # the writer itself: nobody else rewrites its copies
        if bounded["high"] <= max(meta["low"], commit.low_row):
            return None  # e.g. the commit of a clear(): its rows are gone
        return bounded, lambda lo, hi: arrays.read(meta["slot"], lo, hi)
    arrays = PriorityArrays(seg_dir, writable=False)

    def read(lo: int, hi: int) -> np.ndarray:
        m = meta
        for _ in range(_RETRIES):
            if not (m["low"] <= lo and hi <= m["high"]):
                break
            try:
                leaves = arrays.read(m["slot"], lo, hi)
            except CorruptBufferError:
                leaves = None  # damage, or the writer rewriting it: the commit tells
            now = (read_commit(seg_dir) or commit).sampler.get("priority") or {}
            if now.get("seq") == m["seq"]:
                if leaves is None:
                    return arrays.read(m["slot"], lo, hi)  # still named: damage, raised
                return leaves
            m = now  # the writer saved again (and may be rewriting what we read): retry
        raise EmptyBufferError(
            f"{seg_dir}: the writer kept replacing its saved priorities while they were "
            "read; sample again"
        )

    return bounded, read
