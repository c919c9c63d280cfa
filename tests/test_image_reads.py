"""Batched reads of image-codec arrays (issue 36): zreplay's shard reader decodes all
chunks of a read at once (each unpacked into its rows of one array, rowdiff's filters
undone over every frame in one pass, a batch per core) and gets what decoding each chunk
on its own gets, for every image codec, frame shape and selection; a damaged chunk in
the middle of a batch is reported naming its shard file and chunk; a Ctrl-C in a
batched read keeps nothing and holds nothing."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest
import zarr
from conftest import shard_files
from test_image_codecs import frames

import zreplay
from zreplay import CorruptBufferError
from zreplay.store import imagecodec
from zreplay.store.backend_local import LocalBackend
from zreplay.store.imagecodec import chunk_codec
from zreplay.store.layout import IMAGE_CODECS, KeyLayout
from zreplay.store.shards import ChunkCodec, ChunkError

ALL = tuple(IMAGE_CODECS)
SHAPES = [(17, 13), (17, 13, 1), (21, 19, 3), (19, 17, 4)]


def takes(name: str, shape: tuple) -> bool:
    channels = 1 if len(shape) == 2 else shape[2]
    return channels in imagecodec.FORMATS[IMAGE_CODECS[name][0]].channels


def chunk_codec_for(name: str, chunk_shape: tuple) -> ChunkCodec:
    fmt, config = KeyLayout(
        chunk_shape[0], chunk_shape[0], name, IMAGE_CODECS[name][2]
    ).image_config()
    return ChunkCodec(chunk_shape, np.dtype(np.uint8), chunk_codec(fmt, config, chunk_shape), True)


@pytest.mark.parametrize(("name", "shape"), [(n, s) for n in ALL for s in SHAPES if takes(n, s)])
@pytest.mark.parametrize("rows", [1, 3])
def test_a_batch_decodes_as_each_chunk_alone(name, shape, rows):
    """decode_many over chunks with a gap (None: rows left as they are) equals decode of
    each chunk on its own, lossy codecs included (the same decoder, batched)."""
    codec = chunk_codec_for(name, (rows, *shape))
    data = frames(6 * rows, shape, seed=rows).reshape(6, rows, *shape)
    bodies = [codec.encode(block) for block in data]
    bodies[2] = None
    out = np.full((6, rows, *shape), 7, np.uint8)
    codec.decode_many(bodies, out, [("shard", i) for i in range(6)])
    for i, body in enumerate(bodies):
        want = np.full((rows, *shape), 7, np.uint8) if body is None else codec.decode(body)
        assert np.array_equal(out[i], want), (name, shape, rows, i)


@pytest.mark.parametrize("shape", [(48, 96), (48, 64, 3), (33, 70, 4)])
def test_rowdiff_batches_large_and_small_undo_filters_alike(shape):
    """A large batch (its pixel rows summed with one numpy call each over every frame)
    and a small one (imagecodecs' running sum) give each chunk's own decode."""
    codec = chunk_codec_for("rowdiff", (1, *shape))
    data = frames(96, shape, seed=5)
    bodies = [codec.encode(f[None]) for f in data]
    for n in (2, 96):
        out = np.empty((n, 1, *shape), np.uint8)
        codec.decode_many(bodies[:n], out, [("shard", i) for i in range(n)])
        assert np.array_equal(out[:, 0], data[:n]), n
        assert all(np.array_equal(out[i], codec.decode(b)) for i, b in enumerate(bodies[:n]))


def make_buffer(path, name: str, shape: tuple, chunk_rows: int, n: int = 29) -> np.ndarray:
    data = frames(n, shape, seed=n)
    layout = {"pixels": {"codec": name, "chunk_rows": chunk_rows, "shard_rows": 4 * chunk_rows}}
    rb = zreplay.ReplayBuffer(1000, path=path, layout=layout)
    try:
        rb.write_episode({"pixels": data, "reward": np.zeros(n, np.float32)})
    finally:
        rb.close()
    return data


def open_pixels(path, cache_bytes: int = 0):
    backend = LocalBackend()
    ctx = backend.array_context(False, cache_bytes)
    array = backend.open_array(path / "segments" / "default" / "data" / "pixels", False, ctx)[0]
    array.cache.seen(10**6, 0, True)  # as a view's commit would: every row committed
    return array


SELECTIONS = {
    "all, across shards": slice(None),
    "a range inside one shard": slice(5, 7),
    "sorted": np.array([0, 3, 4, 9, 17, 28]),
    "unsorted with repeats": np.array([28, 3, 3, 0, 17, 9, 3, 28]),
    "one row": np.array([11]),
    "empty rows": np.array([], np.int64),
    "an empty range": slice(4, 4),
}


@pytest.mark.parametrize(
    ("name", "shape"),
    [(n, s) for n in ALL for s in [(17, 13), (21, 19, 3), (19, 17, 4)] if takes(n, s)],
)
@pytest.mark.parametrize("chunk_rows", [1, 2])
def test_reads_equal_per_chunk_decodes(tmp_path, name, shape, chunk_rows):
    """Every selection, with and without the chunk cache, reads what plain zarr reads
    (zarr-python decodes chunk by chunk), and lossless codecs read back what was
    written."""
    data = make_buffer(tmp_path, name, shape, chunk_rows)
    plain = zarr.open_array(tmp_path / "segments" / "default" / "data" / "pixels", mode="r")
    want = np.asarray(plain[: len(data)])
    if name in ("png", "webp", "jpegxl", "qoi", "rowdiff"):
        assert np.array_equal(want, data)
    for cache_bytes in (0, 1 << 24):
        array = open_pixels(tmp_path, cache_bytes)
        for _ in range(2):  # the second time from the chunk cache, where there is one
            for what, sel in SELECTIONS.items():
                got = array.read(sel)
                rows = np.arange(len(data))[sel]
                assert got.shape == (len(rows), *shape) and got.dtype == np.uint8, what
                assert np.array_equal(got, want[rows]), (what, cache_bytes)


def test_a_view_reads_rowdiff_frames_in_any_order(tmp_path):
    data = make_buffer(tmp_path, "rowdiff", (24, 20, 3), 1, n=70)
    view = zreplay.open(tmp_path, column_cache_bytes=0)
    try:
        rows = np.random.default_rng(0).integers(0, len(data), 50)
        assert np.array_equal(view.rows(rows, ["pixels"])["pixels"], data[rows])
        assert np.array_equal(view.episode(0)["pixels"], data)
    finally:
        view.close()


def chunk_bytes(path, chunk: int, chunks_per_shard: int) -> tuple:
    """(shard file, offset, size) of chunk ``chunk`` of the pixels array."""
    shard = shard_files(path, "pixels")[chunk // chunks_per_shard]
    raw = shard.read_bytes()
    index = np.frombuffer(raw[-(16 * chunks_per_shard + 4) : -4], "<u8").reshape(-1, 2)
    off, size = index[chunk % chunks_per_shard]
    return shard, int(off), int(size)


@pytest.mark.parametrize("name", ["rowdiff", "png"])
@pytest.mark.parametrize("flip", ["checksum", "checksum recomputed"])
def test_a_damaged_chunk_inside_a_batch_is_named_with_its_file(tmp_path, name, flip):
    """Chunk 21 of 40 (one shard, one batch) damaged: the read fails naming the shard
    file and the chunk, never returns the other 39 frames as if all were well, and
    verify reports it; with the checksum recomputed the codec itself refuses it."""
    import google_crc32c

    n = 40
    layout = {"pixels": {"codec": name, "chunk_rows": 1, "shard_rows": 64}}
    rb = zreplay.ReplayBuffer(1000, path=tmp_path, layout=layout)
    rb.write_episode({"pixels": frames(n, (24, 20, 3)), "reward": np.zeros(n, np.float32)})
    rb.close()
    shard, off, size = chunk_bytes(tmp_path, 21, 64)
    raw = bytearray(shard.read_bytes())
    if flip == "checksum":
        raw[off + size // 2] ^= 0xFF
    else:  # a header no frame of this array has, its crc32c made to match
        raw[off : off + 4] = b"\xff\xff\xff\x7f"
        raw[off + size - 4 : off + size] = google_crc32c.value(
            bytes(raw[off : off + size - 4])
        ).to_bytes(4, "little")
    shard.write_bytes(bytes(raw))
    view = zreplay.open(tmp_path, column_cache_bytes=0)
    try:
        with pytest.raises(CorruptBufferError) as e:
            view.episode(0)
        assert str(shard) in str(e.value) and "chunk 21" in str(e.value), str(e.value)
    finally:
        view.close()
    with pytest.raises(ChunkError, match=re.escape(f"{shard}, chunk 21")):
        open_pixels(tmp_path).read(slice(0, n))
    assert not zreplay.verify(tmp_path).ok


def test_ctrl_c_in_a_batched_read_keeps_and_holds_nothing(tmp_path, monkeypatch):
    """A KeyboardInterrupt in a decode thread, halfway through a read's chunks: it
    reaches the caller, no chunk of that read is kept in the chunk cache, no lock is
    held, and the next read of the same handle returns the right frames."""
    data = make_buffer(tmp_path, "rowdiff", (24, 20, 3), 1, n=64)
    array = open_pixels(tmp_path, cache_bytes=1 << 24)
    unpack = imagecodec.RowDiff.unpack
    calls = []
    lock = threading.Lock()

    def interrupted(self, body, out):
        with lock:
            calls.append(1)
            if len(calls) == 20:
                raise KeyboardInterrupt
        return unpack(self, body, out)

    monkeypatch.setattr(imagecodec.RowDiff, "unpack", interrupted)
    with pytest.raises(KeyboardInterrupt):
        array.read(slice(0, 64))
    assert len(calls) >= 20
    assert not array.cache.lock.locked()
    assert all(b is None for b in array.cache.chunks(array.key, np.arange(64)))
    monkeypatch.setattr(imagecodec.RowDiff, "unpack", unpack)
    assert np.array_equal(array.read(slice(0, 64)), data)
    view = zreplay.open(tmp_path, column_cache_bytes=0)
    try:
        assert np.array_equal(view.episode(0)["pixels"], data)
    finally:
        view.close()
