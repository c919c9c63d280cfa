"""The writer's open shard of one sharded array in an object store.

An object store replaces objects whole, so appending rows to a shard means uploading the
whole shard again.  :class:`ShardWriter` keeps what that takes in memory: the encoded
inner chunks of the shard being filled and the raw rows of its unfinished last chunk.  A
write encodes only the new chunks (and the one it completes), assembles each touched
shard (chunks back to back, then the index and its crc32c, as zarr's ``sharding_indexed``
codec lays it out) and hands it back for one PUT; nothing is read, except once, when a
writer starts in the middle of a shard that an earlier writer began (one GET of it).

Complete chunks keep their bytes and their offsets when the shard is rebuilt (chunks are
laid out in order, and a complete chunk always encodes to the same bytes), which is what
lets readers keep using an index they fetched for the chunks it covered.

A write may start before the end of what the writer holds (the committer retries a
failed commit from its last commit): the rows from there on are dropped and rewritten.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import CorruptBufferError
from .shards import MISSING, ArrayMeta, ChunkError, build_shard, parse_index


class ShardWriter:
    """Rows ``[shard * shard_rows, end)`` of shard ``shard`` of one array: complete chunks
    encoded in ``chunks`` (chunk number within the shard -> bytes), the rows of an
    unfinished last chunk in ``partial`` (also stored, padded, in ``chunks``)."""

    def __init__(
        self,
        meta: ArrayMeta,
        name: str,
        encode_all: Callable[[np.ndarray], list[bytes]] | None = None,
    ):
        """``encode_all(rows)``: the consecutive whole chunks ``rows`` (``[k *
        chunk_rows, *row_shape]``) encoded, in order (default: here, in this thread)."""
        self.meta, self.name = meta, name
        self.encode_all = encode_all or meta.codec.encode_run
        self.shard = -1
        self.end = 0
        self.chunks: dict[int, bytes] = {}
        self.partial = meta.fill_block(0)

    def write(
        self, start: int, values: np.ndarray, load: Callable[[int], object]
    ) -> list[tuple[int, bytes, np.ndarray, int]]:
        """Take rows ``[start, start + len(values))``; returns ``(shard, object bytes,
        index, covers)`` for every touched shard (``covers``: rows of its complete
        chunks).  ``load(shard)`` fetches a shard object (None if there is none)."""
        sr = self.meta.shard_rows
        out = []
        pos, stop = start, start + len(values)
        while pos < stop:
            s = pos // sr
            end = min(stop, (s + 1) * sr)
            self._position(s, pos, load)
            self._append(values[pos - start : end - start])
            body, index = build_shard(self.chunks, self.meta)
            out.append((s, body, index, s * sr + self._complete_rows()))
            pos = end
        return out

    def _complete_rows(self) -> int:
        cr = self.meta.chunk_rows
        return (self.end - self.shard * self.meta.shard_rows) // cr * cr

    def _position(self, s: int, pos: int, load) -> None:
        """Make the held rows end at ``pos`` in shard ``s``."""
        cr, sr = self.meta.chunk_rows, self.meta.shard_rows
        if s != self.shard or pos > self.end:
            self.shard, self.end = s, s * sr
            self.chunks, self.partial = {}, self.meta.fill_block(0)
            if pos > s * sr:
                self._load(s, pos, load)
            return
        if pos == self.end:
            return
        c = (pos - s * sr) // cr  # rewind: rows from pos on are rewritten
        keep = pos - (s * sr + c * cr)
        if keep and len(self.partial) and self.end - len(self.partial) == s * sr + c * cr:
            rows = self.partial[:keep].copy()
        elif keep:
            rows = self.meta.codec.decode(self.chunks[c])[:keep].copy()
        else:
            rows = self.meta.fill_block(0)
        self.chunks = {j: b for j, b in self.chunks.items() if j < c}
        self.partial, self.end = rows, pos

    def _load(self, s: int, pos: int, load) -> None:
        """Rows ``[s * shard_rows, pos)`` from the stored shard (another writer's)."""
        cr, sr = self.meta.chunk_rows, self.meta.shard_rows
        body = load(s)
        where = f"{self.name}, shard {s}"
        if body is None:
            raise CorruptBufferError(
                f"{where}: rows [{s * sr}, {pos}) are committed but their shard is missing; "
                "the segment is damaged (zreplay.verify reports it); restore a checkpoint"
            )
        mv = memoryview(body).cast("B")
        c = (pos - s * sr) // cr
        try:
            index = parse_index(mv[-self.meta.index_nbytes :], self.meta)
            for j in range(c + (1 if (pos - s * sr) % cr else 0)):
                off, nb = int(index[j, 0]), int(index[j, 1])
                if off == MISSING and not self.meta.all_chunks_stored:
                    chunk, rows = None, self.meta.fill_block(cr)  # an older writer's zeros
                else:
                    chunk = bytes(mv[off : off + nb])
                    rows = self.meta.codec.decode(chunk)  # checked; and the partial rows
                if chunk is None and j < c:
                    self.chunks[j] = self.meta.codec.encode(rows)
                    continue
                if j < c:
                    self.chunks[j] = chunk
                else:
                    self.partial = rows[: pos - s * sr - c * cr].copy()
        except (ChunkError, IndexError, OverflowError) as e:
            raise CorruptBufferError(
                f"{where}: the stored shard is damaged ({e}); rows before {pos} cannot be "
                "kept. Run zreplay.verify(path); restore a checkpoint"
            ) from None
        self.end = pos

    def _append(self, values: np.ndarray) -> None:
        cr, s0 = self.meta.chunk_rows, self.shard * self.meta.shard_rows
        base = self.end - len(self.partial)  # first row of the chunk being filled
        data = np.concatenate([self.partial, values]) if len(self.partial) else values
        c = (base - s0) // cr
        n_full = len(data) // cr
        for j, body in enumerate(self.encode_all(data[: n_full * cr])):
            self.chunks[c + j] = body
        rest = data[n_full * cr :]
        self.partial = rest.copy()
        if len(rest):  # stored padded with the fill value; re-encoded when it fills up
            block = self.meta.fill_block(cr)
            block[: len(rest)] = rest
            self.chunks[c + n_full] = self.meta.codec.encode(block)
        else:
            self.chunks.pop(c + n_full, None)
        self.end = base + len(data)
