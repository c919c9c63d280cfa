"""zreplay's own lossless image codec, ``zreplay.rowdiff`` (store/imagecodec.py, RowDiff):
bit-exact round trips of every frame shape it takes (odd sizes, one-row and many-frame
chunks, noise and flat frames), refusals before anything is written, smaller than PNG on
camera frames, the byte layout FORMAT.md documents, damaged and crafted chunks refused
before a reader allocates past the chunk, crafted metadata, and plain zarr reading it in a
fresh process without warnings."""

from __future__ import annotations

import json
import struct
import sys
import tracemalloc

import imagecodecs
import numpy as np
import pytest
import test_image_codecs as tic

import zreplay
from zreplay import CorruptBufferError, SchemaError
from zreplay.store.imagecodec import ImageCodecError, RowDiff, check_frame_shape, chunk_codec
from zreplay.store.layout import KeyLayout

FRAMES = [(1, 1), (1, 9), (9, 1), (3, 5), (1, 1, 3), (1, 7, 4), (6, 1, 1), (3, 5, 3), (5, 3, 4)]
FRAMES += [(3, 5, 1), (17, 13), (16, 21, 3), (19, 17, 4)]


def chunk(rows: int, frame: tuple, kind: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "noise":  # every byte value, every residual
        return rng.integers(0, 256, (rows, *frame), dtype=np.uint8)
    if kind == "flat":
        return np.full((rows, *frame), 255, np.uint8)
    return tic.frames(rows, frame, seed)


@pytest.mark.parametrize("frame", FRAMES)
@pytest.mark.parametrize("rows", [1, 2, 64])
@pytest.mark.parametrize("kind", ["camera", "noise", "flat"])
def test_round_trips_bit_for_bit(frame, rows, kind):
    block = chunk(rows, frame, kind, seed=rows)
    codec = RowDiff({"level": 1}, block.shape)
    body = codec.encode(block)
    got = codec.decode(body)
    assert got.dtype == np.uint8 and got.shape == block.shape
    assert np.array_equal(got, block)
    # a chunk decodes the same on several threads at once (the reader's decode pool)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        assert all(np.array_equal(g, block) for g in pool.map(codec.decode, [body] * 4))


@pytest.mark.parametrize("level", [1, 3, 19, 22])
def test_every_level_round_trips(level):
    block = chunk(3, (16, 21, 3), "camera")
    codec = RowDiff({"level": level}, block.shape)
    assert np.array_equal(codec.decode(codec.encode(block)), block)


@pytest.mark.parametrize(
    "frame, dtype, match",
    [
        ((8, 8, 3), np.float32, "uint8"),
        ((8, 8, 3), np.uint16, "uint8"),
        ((8, 8, 2), np.uint8, "codec 'zstd'"),
        ((8, 8, 5), np.uint8, "codec 'zstd'"),
        ((8,), np.uint8, "uint8 frames"),
        ((2, 8, 8, 3), np.uint8, "uint8 frames"),
    ],
)
def test_refused_shapes_and_dtypes(tmp_path, frame, dtype, match):
    with pytest.raises(ImageCodecError, match=match):
        check_frame_shape("rowdiff", frame, dtype)
    if dtype == np.uint8:
        with pytest.raises(ImageCodecError, match=match):
            chunk_codec("rowdiff", {"level": 1}, (1, *frame))
    with pytest.raises(SchemaError, match=match):
        with tic.episode_buffer(
            100, path=tmp_path / "b", layout={"pixels": {"codec": "rowdiff"}}
        ) as rb:
            rb.write_episode(
                {"pixels": np.zeros((4, *frame), dtype), "terminated": np.arange(4) == 3}
            )
    segs = tmp_path / "b" / "segments"
    assert not any(segs.rglob("c.*")) if segs.exists() else True


def test_a_chunk_of_another_shape_or_dtype_is_refused_on_encode():
    codec = RowDiff({"level": 1}, (2, 4, 4, 3))
    with pytest.raises(ImageCodecError, match="expected uint8"):
        codec.encode(np.zeros((2, 4, 4, 3), np.int8))
    with pytest.raises(ImageCodecError, match="expected uint8"):
        codec.encode(np.zeros((1, 4, 4, 3), np.uint8))


@pytest.mark.parametrize("config", [{"level": 0}, {"level": 23}, {"level": 1.5}, {}, {"x": 1}])
def test_configurations_no_writer_records_are_refused(config):
    with pytest.raises(ImageCodecError):
        RowDiff(config, (1, 4, 4, 3))


def test_the_byte_layout_is_what_format_md_says():
    """A reader without zreplay decodes a chunk with zstd and numpy alone: a 16-byte
    header (rows, height, width, channels), then one zstd frame of the chunk's bytes in C
    order, R - G, G, B - G, A, each pixel row less the row above, mod 256."""
    block = chunk(2, (5, 7, 4), "noise")
    body = RowDiff({"level": 1}, block.shape).encode(block)
    assert struct.unpack_from("<4I", body) == (2, 5, 7, 4)
    res = np.frombuffer(imagecodecs.zstd_decode(body[16:]), np.uint8).reshape(2, 5, 7, 4)
    rows = np.cumsum(res, axis=1, dtype=np.uint8)
    rg, g, bg, a = (rows[..., i] for i in range(4))
    got = np.stack([rg + g, g, bg + g, a], axis=-1)
    assert np.array_equal(got, block)
    grey = chunk(1, (5, 7), "noise")
    body = RowDiff({"level": 1}, grey.shape).encode(grey)
    res = np.frombuffer(imagecodecs.zstd_decode(body[16:]), np.uint8).reshape(1, 5, 7)
    assert np.array_equal(np.cumsum(res, axis=1, dtype=np.uint8), grey)


def test_rendered_frames_stay_near_zstd_over_raw_pixels_and_below_png():
    """Interleaved channels (not planes, which measured twice zstd's bytes on rendered
    and Atari frames) keep flat rendered frames, one a chunk, within a few per cent of
    zstd over raw pixels, and smaller than PNG."""
    sys.path.insert(0, str(tic.ROOT / "benchmarks"))
    import bench_frames

    sim = bench_frames.sim_frames(4, 96, seed=0)
    ours = sum(len(RowDiff({"level": 1}, (1, *f.shape)).encode(f[None])) for f in sim)
    assert ours <= 1.15 * sum(len(imagecodecs.zstd_encode(f, level=1)) for f in sim)
    assert ours < sum(len(imagecodecs.png_encode(f)) for f in sim)


def test_smaller_than_png_on_camera_frames():
    """The reason it exists (benchmarks/bench_frames.py measures the rest): on crops of
    real photos with sensor noise it takes fewer bytes than PNG."""
    import skimage.data

    rng = np.random.default_rng(0)
    for img in (skimage.data.astronaut(), skimage.data.coffee(), skimage.data.chelsea()):
        crop = img[40:264, 60:284].astype(np.float64) + rng.normal(0, 2, (224, 224, 3))
        frame = np.clip(np.rint(crop), 0, 255).astype(np.uint8)[None]
        ours = len(RowDiff({"level": 1}, frame.shape).encode(frame))
        assert ours < len(imagecodecs.png_encode(frame[0]))


def test_damaged_chunks_are_refused():
    block = chunk(3, (16, 21, 3), "camera")
    codec = RowDiff({"level": 1}, block.shape)
    body = codec.encode(block)
    for bad, match in [
        (body[:10], "header"),
        (body[:16], "does not decode|holds"),
        (body[:-5], "does not decode"),
        (body[:16] + imagecodecs.zstd_encode(b"\0" * 100), "holds 100 bytes"),
        (body[:16] + b"not zstd" * 10, "does not decode"),
    ]:
        with pytest.raises(ImageCodecError, match=match):
            codec.decode(bad)


@pytest.mark.parametrize(
    "header", [(3, 1 << 30, 1 << 30, 3), (1 << 31, 16, 21, 3), (3, 16, 21, 4), (3, 16, 21, 1)]
)
def test_crafted_headers_are_refused_before_allocating(header):
    """Huge declared sizes or another plane count than the array's metadata: refused from
    the header, and a zstd frame declaring more than the chunk is refused by zstd writing
    into the chunk's own buffer: a reader never allocates past the declared chunk."""
    codec = RowDiff({"level": 1}, (3, 16, 21, 3))
    huge = imagecodecs.zstd_encode(b"\0" * (8 << 20))
    for body in (struct.pack("<4I", *header) + huge, codec.header + huge):
        tracemalloc.start()
        try:
            with pytest.raises(ImageCodecError, match="header|does not decode"):
                codec.decode(body)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20


def test_a_buffer_stores_samples_and_verifies_rowdiff(tmp_path):
    eps = tic.write_episodes(tmp_path / "b", "rowdiff", (24, 20, 3))
    chain = tic.pixel_codec(tmp_path / "b")
    assert chain[0] == {"name": "zreplay.rowdiff", "configuration": {"level": 1}}
    assert chain[1]["name"] == "crc32c"
    view = zreplay.open(tmp_path / "b", seed=0)
    for i, ep in enumerate(eps):
        assert np.array_equal(view.episode(i)["pixels"], ep["pixels"])
    assert view.sample(32)["pixels"].shape == (32, 24, 20, 3)
    assert zreplay.verify(tmp_path / "b").ok
    grey = tic.write_episodes(tmp_path / "g", "rowdiff", (24, 20))
    assert np.array_equal(zreplay.open(tmp_path / "g").episode(2)["pixels"], grey[2]["pixels"])


def test_a_level_is_chosen_per_key(tmp_path):
    with tic.episode_buffer(
        100, path=tmp_path / "b", layout={"pixels": {"codec": "rowdiff", "level": 9}}
    ) as rb:
        rb.write_episode({"pixels": tic.frames(4, (24, 20, 3)), "terminated": np.arange(4) == 3})
    assert tic.pixel_codec(tmp_path / "b")[0]["configuration"] == {"level": 9}
    with pytest.raises(SchemaError, match="level"):
        KeyLayout(1, 1, "zstd", 1).with_overrides({"codec": "rowdiff", "level": 0})


def test_verify_reports_damaged_bytes(tmp_path):
    tic.write_episodes(tmp_path / "b", "rowdiff")
    shard = tic.shard_of(tmp_path / "b")
    raw = bytearray(shard.read_bytes())
    raw[30] ^= 0xFF  # inside the first chunk's zstd frame
    shard.write_bytes(bytes(raw))
    report = zreplay.verify(tmp_path / "b")
    assert not report.ok and "pixels" in str(report)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda c, m: c["configuration"].update(level=99), "level"),
        (lambda c, m: c["configuration"].update(bogus=1), "parameters"),
        (lambda c, m: c.update(configuration="x"), "not an object"),
        (lambda c, m: c["configuration"].pop("level"), "parameters"),
    ],
)
def test_crafted_codec_metadata_is_refused_clearly(tmp_path, edit, match):
    tic.write_episodes(tmp_path / "b", "rowdiff")
    tic.edit_codec(tmp_path / "b", edit)
    with pytest.raises(CorruptBufferError, match=match):
        zreplay.open(tmp_path / "b").episode(0)


def test_plain_zarr_reads_it_in_a_fresh_process_without_warnings(tmp_path):
    site = tic.entry_point_site(tmp_path)
    for shape in ((24, 20, 3), (24, 20, 4), (24, 20)):
        path = tmp_path / "x".join(map(str, shape))
        tic.write_episodes(path, "rowdiff", shape)
        want = np.concatenate([zreplay.open(path).episode(i)["pixels"] for i in range(3)])
        code = tic.PLAIN_READ.format(path=str(path), allow_zreplay=True)
        out = tic.run_plain_zarr(code, [site, tic.ROOT / "src"])
        assert out.returncode == 0, out.stderr
        size = "x".join(map(str, (18, *shape)))
        assert out.stdout.split() == ["uint8", size, str(int(want.sum()))]
    meta = json.loads((path / "segments/default/data/pixels/zarr.json").read_text())
    assert "zreplay.rowdiff" in json.dumps(meta)


def test_a_buffer_written_with_zstd_keeps_it_when_reopened_and_appended(tmp_path, monkeypatch):
    """A new default never changes an existing key: its codec is in its array's
    metadata and the buffer's recorded layout, for the segment written before and for a
    new writer's segment alike."""
    from zreplay.store import layout

    path = tmp_path / "b"
    monkeypatch.setattr(layout, "DEFAULT_IMAGE_CODEC", None)  # zreplay before rowdiff
    old = tic.write_episodes(path, None)
    monkeypatch.undo()
    assert layout.DEFAULT_IMAGE_CODEC == "rowdiff"
    more = tic.write_episodes(path, None)  # reopened, appended
    other = tic.write_episodes(path, None, writer_id="w2")
    for writer in ("default", "w2"):
        names = [c["name"] for c in tic.pixel_codec(path, writer)]
        assert names == ["bytes", "zstd", "crc32c"], writer
    view = zreplay.open(path)
    got = np.concatenate([view.episode(i)["pixels"] for i in range(view.num_episodes)])
    want = np.concatenate([e["pixels"] for e in old + more + other])
    assert view.num_episodes == 9
    assert sorted(map(bytes, got)) == sorted(map(bytes, want))
    assert zreplay.verify(path).ok
