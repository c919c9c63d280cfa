"""Local arrays that TensorStore cannot open: those stored with an image codec.

TensorStore refuses a ``zarr.json`` naming a codec it does not know, and zarr-python's
per-call overhead must stay off the sampling path, so the local backend reads and writes
such arrays with zreplay's own shard reader and writer
(:class:`~zreplay.store.objectarray.ObjectArray`) over the array's files, as an object
store would be: :class:`FileObjects` is the ``get``/``put`` it calls.  Chunks are
decoded and encoded on that reader's I/O threads (imagecodecs releases the GIL), never
under the writer's lock; every chunk keeps its crc32c.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .objectarray import ObjectArray, ShardCache


@dataclass(frozen=True)
class FileObjects:
    """Whole files and byte ranges of files as objects (keys: absolute paths); a file is
    replaced whole (temp file + rename, fsync'd if ``durable``), never changed in place,
    so a reader's ranges always come from one version of a shard."""

    durable: bool
    publish: Callable  # the backend's publish(path, data, durable)

    def get(self, requests: Sequence, missing_ok: bool = False) -> list:
        """``(path, None)`` a whole file, ``(path, (a, z))`` bytes ``[a, z)``, ``(path,
        (-n, None))`` its last n bytes; None for a missing file if ``missing_ok``."""
        return [self._get(key, rng, missing_ok) for key, rng in requests]

    def _get(self, key: str, rng, missing_ok: bool) -> bytes | None:
        try:
            fd = os.open(key, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            if missing_ok:
                return None
            raise
        try:
            size = os.fstat(fd).st_size
            if rng is None:
                a, z = 0, size
            elif rng[0] < 0:
                a, z = max(0, size + rng[0]), size
            else:
                a, z = rng[0], size if rng[1] is None else min(rng[1], size)
            parts, pos = [], a
            while pos < z:
                part = os.pread(fd, z - pos, pos)
                if not part:
                    break
                parts.append(part)
                pos += len(part)
            return b"".join(parts)
        finally:
            os.close(fd)

    def put(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Replace each file ``path`` with ``data`` atomically."""
        for key, data in items:
            loc = Path(key)
            loc.parent.mkdir(parents=True, exist_ok=True)
            self.publish(loc, data, self.durable)


def open_files_array(loc, meta, writable: bool, files: FileObjects, cache: ShardCache):
    """``(handle, fills_missing)`` of the array at ``loc`` (parsed ``meta``: a
    :class:`~zreplay.store.shards.ArrayMeta`), read and written by zreplay's shard code
    through ``files``; ``cache``: the array's shard cache (kept across reopens)."""
    array = ObjectArray(files, os.path.abspath(loc), meta, writable, cache)
    return array, not meta.all_chunks_stored
