"""Zarr v3 arrays as bytes: chunk codecs, shard indexes, and the shard a writer assembles.

What the object-store backend needs to read and write the arrays zreplay creates without
zarr-python on the data path (see FORMAT.md, "Chunks, shards, codecs"):

* :class:`ArrayMeta`: an array's ``zarr.json`` parsed: rows per inner chunk and per shard
  (row axis only; every other axis is whole), the codec chain, fill value, whether every
  chunk is stored.  Chains other than ``bytes`` + ``zstd``/``blosc``/none + ``crc32c``,
  or one of zreplay's image codecs (:mod:`zreplay.store.imagecodec`) + ``crc32c``, are
  not handled here (the backend reads such arrays with zarr-python).
* :class:`ChunkCodec`: one inner chunk ``<-> bytes``, checksum verified on decode
  (:class:`ChunkError` otherwise).
* :func:`parse_index` / :func:`build_shard`: a shard object is its chunks back to back
  followed by the index ``uint64 [n_chunks, 2]`` (offset, size; ``2**64 - 1`` for a chunk
  not stored) and the index's crc32c, as zarr's ``sharding_indexed`` codec writes it.
* :func:`merge_ranges`: byte ranges of one object merged into fewer requests.

Pure bytes and numpy: no I/O here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import google_crc32c
import numcodecs
import numpy as np

from ..errors import CorruptBufferError, MissingCodecError
from .imagecodec import FORMATS, ImageCodecError, check_frame_shape, chunk_codec, format_of
from .layout import shard_key

MISSING = 2**64 - 1


class ChunkError(ValueError):
    """A chunk or shard index failed its checksum, did not decode, or is not stored."""


class UnsupportedArray(ValueError):
    """An array layout this module does not handle (read it with zarr-python)."""


def crc32c(data) -> bytes:
    return google_crc32c.value(data).to_bytes(4, "little")


def _strip_crc(buf) -> memoryview:
    mv = memoryview(buf).cast("B")
    if len(mv) < 4:
        raise ChunkError("a chunk shorter than its checksum")
    body = mv[:-4]
    # (google_crc32c takes bytes or numpy arrays, not memoryviews)
    if google_crc32c.value(np.frombuffer(body, np.uint8)).to_bytes(4, "little") != bytes(mv[-4:]):
        raise ChunkError("crc32c checksum mismatch")
    return body


@dataclass
class ChunkCodec:
    """Encode/decode one chunk of ``shape`` (C order) through the array's codec chain."""

    shape: tuple
    dtype: np.dtype
    compressor: object | None  # a numcodecs codec, an image FrameCodec, or None
    crc: bool

    def encode(self, block: np.ndarray) -> bytes:
        raw = np.ascontiguousarray(block, self.dtype)
        body = bytes(self.compressor.encode(raw)) if self.compressor is not None else raw.tobytes()
        return body + crc32c(body) if self.crc else body

    def encode_run(self, rows: np.ndarray) -> list[bytes]:
        """Consecutive chunks ``[k * shape[0], *shape[1:]]`` as the ``k`` chunks' bytes,
        in order; a codec that encodes a run at once (:class:`~.imagecodec.RowDiff`)
        takes it whole."""
        raw = np.ascontiguousarray(rows, self.dtype)
        whole = getattr(self.compressor, "encode_run", None)
        if whole is None:
            cr = self.shape[0]
            return [self.encode(raw[i : i + cr]) for i in range(0, len(raw), cr)]
        bodies = whole(raw)
        return [b + crc32c(b) for b in bodies] if self.crc else bodies

    def decode(self, data) -> np.ndarray:
        try:
            body = _strip_crc(data) if self.crc else memoryview(data).cast("B")
            raw = self.compressor.decode(body) if self.compressor is not None else body
            return np.frombuffer(raw, self.dtype).reshape(self.shape)
        except (ChunkError, MissingCodecError):
            raise
        except Exception as e:  # noqa: BLE001 - numcodecs/imagecodecs raise many kinds
            raise ChunkError(f"a chunk does not decode ({type(e).__name__}: {e})") from None

    def decode_many(self, bodies: list, out: np.ndarray, where: list) -> None:
        """Decode chunk ``bodies[i]`` (encoded bytes; None: leave its rows) into
        ``out[i]`` (``[len(bodies), *shape]`` of ``dtype``, C order).  An image codec
        unpacks each chunk straight into its rows and undoes its filters over all of
        them at once; other codecs decode chunk by chunk.  ChunkError naming
        ``where[i]`` (``(object, chunk)``) for a chunk that fails its checksum or does
        not decode; MissingCodecError as it comes."""
        frames = self.compressor
        batched = hasattr(frames, "undo_filters")
        for i, body in enumerate(bodies):
            if body is None:
                continue
            try:
                if not batched:
                    out[i] = self.decode(body)
                    continue
                frames.unpack(_strip_crc(body) if self.crc else body, out[i])
            except MissingCodecError:
                raise
            except Exception as e:  # noqa: BLE001 - as decode: a chunk that does not decode
                obj, chunk = where[i]
                raise ChunkError(f"{obj}, chunk {chunk}: {e}") from None
        if batched:  # over each run of chunks decoded here: the rows left stay as they are
            held = np.flatnonzero([b is not None for b in bodies])
            for run in np.split(held, np.flatnonzero(np.diff(held) > 1) + 1):
                if len(run):
                    frames.undo_filters(out[run[0] : run[-1] + 1])


def _codec(chain: list, dtype: np.dtype, shape: tuple, where: str) -> ChunkCodec:
    names = [c["name"] for c in chain]
    crc = bool(names) and names[-1] == "crc32c"
    body = names[:-1] if crc else names
    if len(body) == 1 and format_of(body[0]) is not None:
        fmt = format_of(body[0])
        try:
            if fmt in FORMATS:  # the array's own dtype (a FrameCodec takes uint8 as given)
                check_frame_shape(fmt, shape[1:], dtype)
            frames = chunk_codec(fmt, chain[0].get("configuration") or {}, shape)
        except ImageCodecError as e:
            raise CorruptBufferError(f"{where}: {e}") from None
        except MissingCodecError as e:
            raise MissingCodecError(e.codec, e.reason, where) from None
        return ChunkCodec(shape, dtype, frames, crc)
    if not body or body[0] != "bytes" or len(body) > 2 or "crc32c" in body:
        raise UnsupportedArray(f"{where}: codecs {names}")
    endian = (chain[0].get("configuration") or {}).get("endian", "little")
    if dtype.itemsize > 1:
        dtype = dtype.newbyteorder("<" if endian == "little" else ">")
    comp = None
    if len(body) == 2:
        c = chain[1].get("configuration") or {}
        if body[1] == "zstd":
            comp = numcodecs.Zstd(level=int(c.get("level", 0)), checksum=bool(c.get("checksum")))
        elif body[1] == "blosc":
            shuffle = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}[c.get("shuffle", "noshuffle")]
            comp = numcodecs.Blosc(
                cname=c.get("cname", "zstd"),
                clevel=int(c.get("clevel", 5)),
                shuffle=shuffle,
                blocksize=int(c.get("blocksize", 0)),
                typesize=int(c.get("typesize") or dtype.itemsize),
            )
        else:
            raise UnsupportedArray(f"{where}: codec {body[1]!r}")
    return ChunkCodec(shape, dtype, comp, crc)


@dataclass
class ArrayMeta:
    """One array's ``zarr.json``, parsed (rows on axis 0; see the module docstring).

    ``shard_rows`` is None for an unsharded array: then each chunk is its own object."""

    meta: dict = field(repr=False)
    shape: tuple
    dtype: np.dtype
    chunk_rows: int
    shard_rows: int | None
    codec: ChunkCodec = field(repr=False)
    index_crc: bool
    fill_value: object
    all_chunks_stored: bool
    separator: str

    @classmethod
    def parse(cls, raw: bytes, where: str) -> ArrayMeta:
        try:
            meta = json.loads(raw)
            shape = tuple(int(x) for x in meta["shape"])
            dtype = np.dtype("?" if meta["data_type"] == "bool" else meta["data_type"])
            grid = [int(x) for x in meta["chunk_grid"]["configuration"]["chunk_shape"]]
            codecs = meta["codecs"]
            enc = meta.get("chunk_key_encoding") or {}
        except (ValueError, KeyError, TypeError) as e:
            raise UnsupportedArray(f"{where}: {e}") from None
        if enc.get("name", "default") != "default" or meta.get("storage_transformers"):
            raise UnsupportedArray(f"{where}: chunk keys {enc}")
        if not shape or grid[1:] != list(shape[1:]):
            raise UnsupportedArray(f"{where}: chunks split a non-row axis")
        shard_rows, index_crc = None, False
        chain = codecs
        chunk = grid
        if len(codecs) == 1 and codecs[0]["name"] == "sharding_indexed":
            cfg = codecs[0]["configuration"]
            chunk = [int(x) for x in cfg["chunk_shape"]]
            idx = [c["name"] for c in cfg.get("index_codecs", [])]
            endian = ((cfg.get("index_codecs") or [{}])[0].get("configuration") or {}).get(
                "endian", "little"
            )
            if (
                chunk[1:] != list(shape[1:])
                or chunk[0] < 1
                or grid[0] % chunk[0]
                or cfg.get("index_location", "end") != "end"
                or idx not in (["bytes"], ["bytes", "crc32c"])
                or endian != "little"
            ):
                raise UnsupportedArray(f"{where}: sharding {cfg}")
            shard_rows, index_crc, chain = grid[0], idx == ["bytes", "crc32c"], cfg["codecs"]
        codec = _codec(chain, dtype, (chunk[0], *shape[1:]), where)
        stored = ((meta.get("attributes") or {}).get("zreplay") or {}).get("all_chunks_stored")
        sep = (enc.get("configuration") or {}).get("separator", "/")
        return cls(
            meta=meta,
            shape=shape,
            dtype=codec.dtype,
            chunk_rows=chunk[0],
            shard_rows=shard_rows,
            codec=codec,
            index_crc=index_crc,
            fill_value=meta.get("fill_value", 0) or 0,
            all_chunks_stored=stored is True,
            separator=sep,
        )

    @property
    def row_shape(self) -> tuple:
        return self.shape[1:]

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def chunks_per_shard(self) -> int:
        return (self.shard_rows or self.chunk_rows) // self.chunk_rows

    @property
    def index_nbytes(self) -> int:
        return 16 * self.chunks_per_shard + (4 if self.index_crc else 0)

    def object_key(self, i: int) -> str:
        """Key (relative to the array) of shard ``i`` (chunk ``i`` if unsharded)."""
        return shard_key(self.separator, i, len(self.shape))

    def fill_block(self, rows: int) -> np.ndarray:
        return np.full((rows, *self.row_shape), self.fill_value, self.dtype)

    def resized(self, rows: int) -> tuple[ArrayMeta, bytes]:
        """This array made ``rows`` rows long, and its new ``zarr.json``."""
        meta = json.loads(json.dumps(self.meta))
        meta["shape"][0] = int(rows)
        raw = json.dumps(meta, indent=2).encode()
        return ArrayMeta.parse(raw, "resize"), raw


def parse_index(raw, meta: ArrayMeta, where: str = "a shard") -> np.ndarray:
    """A shard's index ``uint64 [chunks per shard, 2]`` from its last ``index_nbytes``
    (``where``: the shard, named in errors)."""
    body = _strip_crc(raw) if meta.index_crc else memoryview(raw).cast("B")
    if len(body) != 16 * meta.chunks_per_shard:
        raise ChunkError(f"{where}: an index of {len(body)} bytes")
    index = np.frombuffer(body, "<u8").reshape(meta.chunks_per_shard, 2)
    # Offsets and sizes become int64 byte ranges: past 2**62 no object could hold them.
    stored = index[:, 0] != np.uint64(MISSING)
    if np.any(index[stored] >= np.uint64(1 << 62)):
        raise ChunkError(f"{where}: an index entry past any object's size")
    # Every writer puts each chunk in bytes of its own: entries that share bytes would
    # read one chunk's rows as another's, checksums and all.
    ranges = index[stored].astype(np.int64)
    if len(ranges) > 1:
        ranges = ranges[np.argsort(ranges[:, 0], kind="stable")]
        if np.any(ranges[:-1, 0] + ranges[:-1, 1] > ranges[1:, 0]):
            raise ChunkError(f"{where}: index entries overlap (two chunks in the same bytes)")
    return index


def build_shard(chunks: dict[int, bytes], meta: ArrayMeta) -> tuple[bytes, np.ndarray]:
    """The shard object holding ``chunks`` (chunk number within the shard -> encoded
    bytes), chunks in order and back to back, and its index."""
    index = np.full((meta.chunks_per_shard, 2), MISSING, np.uint64)
    parts, off = [], 0
    for j in sorted(chunks):
        b = chunks[j]
        index[j] = (off, len(b))
        parts.append(b)
        off += len(b)
    ib = index.astype("<u8").tobytes()
    parts.append(ib + crc32c(ib) if meta.index_crc else ib)
    return b"".join(parts), index


def merge_ranges(starts: np.ndarray, ends: np.ndarray, gap: int) -> list[tuple[int, int]]:
    """Sorted, non-overlapping ``[start, end)`` ranges merged where at most ``gap`` bytes
    lie between them: fewer, larger requests."""
    if not len(starts):
        return []
    breaks = np.flatnonzero(starts[1:] - ends[:-1] > gap) + 1
    firsts = np.concatenate([[0], breaks])
    lasts = np.concatenate([breaks - 1, [len(starts) - 1]])
    return list(zip(starts[firsts].tolist(), ends[lasts].tolist(), strict=True))
