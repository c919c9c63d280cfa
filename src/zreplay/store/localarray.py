"""Local arrays that TensorStore cannot open: those stored with an image codec.

TensorStore refuses a ``zarr.json`` naming a codec it does not know, and zarr-python's
per-call overhead must stay off the sampling path, so the local backend reads and writes
such arrays with zreplay's own shard reader and writer
(:class:`~zreplay.store.objectarray.ObjectArray`) over the array's files, as an object
store would be: :class:`FileObjects` is the ``get``/``put`` it calls.  Chunks are
decoded and encoded on that reader's I/O threads (imagecodecs releases the GIL), never
under the writer's lock; every chunk keeps its crc32c.

The array's directory is untrusted and may change after it was opened: every file open
refuses a symbolic link, a FIFO or a device (the local backend's ``open_regular``, as
the rest of the store), and no read takes more bytes than a shard of the array could hold
(:func:`shard_bytes_bound`), whatever the file's size or its index says.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from pathlib import Path

from ..errors import CorruptBufferError
from .objectarray import ObjectArray, ShardCache
from .shards import ArrayMeta

# What one encoded chunk may take beyond 4x its raw bytes (headers of tiny frames): far
# above what any codec zreplay writes produces, so only a damaged or crafted file is over.
_CHUNK_SLACK = 64 << 10


def shard_bytes_bound(meta: ArrayMeta) -> int:
    """The most bytes a shard (or, unsharded, a chunk) file of the array ``meta`` can
    hold: every chunk at 4x its raw size plus slack, and the index."""
    raw = meta.chunk_rows * meta.row_bytes
    return meta.chunks_per_shard * (4 * raw + _CHUNK_SLACK) + meta.index_nbytes


@dataclass(frozen=True)
class FileObjects:
    """Whole files and byte ranges of files as objects (keys: absolute paths); a file is
    replaced whole (temp file + rename, fsync'd if ``durable``), never changed in place,
    so a reader's ranges always come from one version of a shard."""

    durable: bool
    # The backend, not its bound publish: looked up at each put, so what wraps the
    # backend's methods after this was made (tests/faultlib.py) sees every shard write.
    backend: object
    max_bytes: int  # the most one get reads (shard_bytes_bound)

    # Ranges of one file at most this far apart are read as one (the shard reader's
    # merge; an object store's is 1 MiB): a local read costs its bytes more than its
    # requests, which are preads of one open file
    gap = 16 << 10

    def get(self, requests: Sequence, missing_ok: bool = False) -> list:
        """``(path, None)`` a whole file, ``(path, (a, z))`` bytes ``[a, z)``, ``(path,
        (-n, None))`` its last n bytes; None for a missing file if ``missing_ok``.
        Neighbouring requests of one file are read through one open of it."""
        out: list = []
        for key, group in groupby(requests, key=itemgetter(0)):
            out.extend(self._get(key, [rng for _, rng in group], missing_ok))
        return out

    def _get(self, key: str, ranges: list, missing_ok: bool) -> list:
        try:
            fd, st = self.backend.open_regular(key, follow=False)
        except FileNotFoundError:
            if missing_ok:
                return [None] * len(ranges)
            raise
        try:
            return [self._read(fd, key, st.st_size, rng) for rng in ranges]
        finally:
            os.close(fd)

    def _read(self, fd: int, key: str, size: int, rng) -> bytes:
        if rng is None:
            a, z = 0, size
        elif rng[0] < 0 and rng[1] is None:
            a, z = max(0, size + rng[0]), size
        elif rng[0] < 0:
            raise CorruptBufferError(f"{key}: a read of bytes {rng} (a damaged index)")
        else:
            a, z = rng[0], size if rng[1] is None else min(rng[1], size)
        if z - a > self.max_bytes:
            raise CorruptBufferError(
                f"{key}: a read of {z - a:,} bytes of a {size:,}-byte file, more than a "
                f"shard of this array can hold ({self.max_bytes:,}); the file is damaged "
                "or was crafted. Run zreplay.verify(path); restore a checkpoint"
            )
        parts, pos = [], a
        while pos < z:
            part = os.pread(fd, z - pos, pos)
            if not part:
                break
            parts.append(part)
            pos += len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def put(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Replace each file ``path`` with ``data`` atomically."""
        for key, data in items:
            loc = Path(key)
            loc.parent.mkdir(parents=True, exist_ok=True)
            self.backend.publish(loc, data, self.durable)


def open_files_array(
    loc, meta: ArrayMeta, writable: bool, backend, durable: bool, cache: ShardCache
):
    """``(handle, fills_missing)`` of the array at ``loc`` (parsed ``meta``), read and
    written by zreplay's shard code through :class:`FileObjects` over ``backend``'s
    files (fsync'd if ``durable``); ``cache``: the array's shard cache (kept across
    reopens)."""
    files = FileObjects(durable, backend, shard_bytes_bound(meta))
    array = ObjectArray(files, os.path.abspath(loc), meta, writable, cache)
    return array, not meta.all_chunks_stored
