"""Persisted priorities: two float64 arrays over a segment's row axis, written in turn.

``segments/<writer_id>/priority/0`` and ``.../priority/1`` each hold one tree leaf per
global row (``leaf[r]`` at index ``r``).  The commit record names the copy that is valid
(``commit.sampler["priority"]["slot"]``) and the rows it covers; a writer only ever writes
the *other* copy and then publishes a commit naming it, so a crash in the middle of a
write leaves the named copy intact (shadow paging).  Rows outside the named range are
garbage.  Chunks are replaced atomically (temp file + rename) like every other file, so
hard-linked checkpoints keep their bytes.  Nothing here knows what a leaf means.
"""

from __future__ import annotations

import numpy as np
import zarr

from ..errors import CorruptBufferError
from .location import Location, location, zarr_store
from .segment import ArrayHandle, io_context

GROUP = "priority"
SLOTS = (0, 1)
CHUNK_ROWS = 16384


def slot_path(seg_dir: Location, slot: int) -> Location:
    return location(seg_dir) / GROUP / str(int(slot))


class PriorityArrays:
    """The two priority copies of one segment (created on the first write)."""

    def __init__(self, seg_dir: str | Location, writable: bool, durable: bool = True):
        self.dir = location(seg_dir)
        self.writable = writable
        self._context = io_context(durable)
        self._handles: dict[int, ArrayHandle] = {}
        self._dropped_below = {s: 0 for s in SLOTS}

    def _create(self) -> None:
        from zarr.codecs import Crc32cCodec, ZstdCodec

        g = zarr.open_group(zarr_store(self.dir), mode="a", zarr_format=3).require_group(GROUP)
        for s in SLOTS:
            if str(s) not in g:
                g.create_array(
                    str(s),
                    shape=(CHUNK_ROWS,),
                    dtype="float64",
                    chunks=(CHUNK_ROWS,),
                    fill_value=0.0,
                    compressors=[ZstdCodec(level=1), Crc32cCodec()],
                    config={"write_empty_chunks": True},
                )

    def _handle(self, slot: int) -> ArrayHandle:
        h = self._handles.get(slot)
        if h is None:
            path = slot_path(self.dir, slot)
            if self.writable and not (path / "zarr.json").is_file():
                self._create()
            h = self._handles[slot] = ArrayHandle(path, self._context, self.writable)
        return h

    def write(self, slot: int, start: int, leaves: np.ndarray) -> None:
        """Write ``leaves: float64[k]`` at rows ``[start, start + k)`` of copy ``slot``
        (growing it), then delete chunk files wholly below ``start`` (evicted rows)."""
        h = self._handle(slot)
        stop = start + len(leaves)
        if len(leaves):
            h.grow_to(stop, CHUNK_ROWS)
            h.store[start:stop].write(np.asarray(leaves, np.float64)).result()
        self._drop_below(slot, start)

    def _drop_below(self, slot: int, row: int) -> None:
        first, last = self._dropped_below[slot], row // CHUNK_ROWS
        for c in range(first, last):
            (slot_path(self.dir, slot) / "c" / str(c)).unlink(missing_ok=True)
        self._dropped_below[slot] = max(first, last)

    def read(self, slot: int, start: int, stop: int) -> np.ndarray:
        """Leaves ``float64[stop - start]`` of rows ``[start, stop)`` of copy ``slot``."""
        if stop <= start:
            return np.zeros(0, np.float64)
        try:
            store = self._handle(slot).reopen_if_short(stop)
            return np.asarray(store[start:stop].read().result(), np.float64)
        except Exception as e:  # TensorStore/zarr report damage and absence variously
            raise CorruptBufferError(
                f"{self.dir}: priorities of rows [{start}, {stop}) (copy {slot}) cannot be "
                f"read ({e})"
            ) from None
