"""The lossy option for camera frames (issue 36, item 3): layout codec ``jpeg-444``,
libjpeg-turbo with chroma kept whole and Huffman tables optimized, recorded in the
array's zarr.json as ``zreplay.jpeg`` with ``subsampling`` and ``optimize``; odd frame
sizes, one and three channels and one-row chunks round-trip; a reopened buffer appends
with the recorded setting; plain zarr reads it in a fresh process; verify reports damaged
frames; crafted values of the new parameters are refused at open, and ``zreplay.jpeg``
written before them (no ``subsampling``) still reads."""

from __future__ import annotations

import sys

import imagecodecs
import numpy as np
import pytest
from test_image_codecs import (
    PLAIN_READ,
    ROOT,
    codec_for,
    edit_codec,
    entry_point_site,
    episode_buffer,
    frames,
    pixel_codec,
    psnr,
    run_plain_zarr,
    write_episodes,
)

import zreplay
from zreplay import CorruptBufferError, SchemaError
from zreplay.schema import KeySpec
from zreplay.store.imagecodec import FrameCodec, ImageCodecError
from zreplay.store.layout import LOSSY_IMAGE_CODECS, KeyLayout, layouts_for

JPEG_444 = {"quality": 94, "subsampling": "444", "optimize": True}


def colour_edges(n: int, shape: tuple) -> np.ndarray:
    """Frames of sharp red/blue stripes one pixel apart: what 4:2:0 blurs and 4:4:4 keeps."""
    h, w, _ = shape
    x = np.arange(w)[None, :, None] + np.arange(n)[:, None, None]
    red = (x % 2 == 0) * np.array([220, 30, 30])
    blue = (x % 2 == 1) * np.array([30, 30, 220])
    return np.broadcast_to((red + blue)[:, None], (n, h, w, 3)).astype(np.uint8)


def sampling_factors(jpeg: bytes) -> list[int]:
    """The (horizontal << 4 | vertical) sampling byte of each component in a baseline or
    progressive JPEG's start-of-frame segment."""
    i = 2
    while i < len(jpeg):
        marker, length = jpeg[i + 1], int.from_bytes(jpeg[i + 2 : i + 4], "big")
        if marker in (0xC0, 0xC1, 0xC2):
            n = jpeg[i + 9]
            return [jpeg[i + 10 + 3 * k + 1] for k in range(n)]
        i += 2 + length
    raise AssertionError("no start-of-frame segment")


@pytest.mark.parametrize("shape", [(17, 13), (17, 13, 1), (23, 19, 3), (1, 1, 3)])
@pytest.mark.parametrize("rows", [1, 3])
def test_jpeg_444_round_trips_odd_sizes_one_and_three_channels(shape, rows):
    codec = codec_for("jpeg-444", (rows, *shape))
    block = frames(rows, shape)
    got = codec.decode(codec.encode(block))
    assert got.shape == block.shape and got.dtype == np.uint8
    assert psnr(got, block) > 30, psnr(got, block)


def test_jpeg_444_refuses_four_channels_before_encoding():
    with pytest.raises(ImageCodecError, match="channels"):
        codec_for("jpeg-444", (1, 16, 16, 4))
    spec = KeySpec("pixels", np.dtype(np.uint8), (16, 16, 4))
    with pytest.raises(SchemaError, match="channels"):
        layouts_for({"pixels": spec}, {"pixels": {"codec": "jpeg-444"}})


def test_jpeg_444_is_libjpeg_turbo_444_with_optimized_tables():
    block = frames(1, (48, 40, 3))
    body = codec_for("jpeg-444", block.shape).encode(block)
    frame = body[8:]  # after the count and the one size
    want = imagecodecs.jpeg8_encode(block[0], level=94, subsampling="444", optimize=True)
    assert frame == bytes(want)
    assert sampling_factors(frame) == [0x11, 0x11, 0x11]  # no component subsampled
    plain = codec_for("jpeg", block.shape).encode(block)[8:]
    assert sampling_factors(plain) == [0x22, 0x11, 0x11]  # 4:2:0, as before


def test_jpeg_444_keeps_colour_detail_that_420_loses():
    block = colour_edges(2, (32, 32, 3))
    q444 = FrameCodec("jpeg", JPEG_444, block.shape)
    q420 = FrameCodec("jpeg", {"quality": 94}, block.shape)
    assert (
        psnr(q444.decode(q444.encode(block)), block)
        > psnr(q420.decode(q420.encode(block)), block) + 10
    )


def test_layout_option_defaults_and_ranges():
    spec = KeyLayout(1, 64, "zstd", 1)
    lay = spec.with_overrides({"codec": "jpeg-444"})
    assert lay.level == 94 and lay.image_config() == ("jpeg", JPEG_444)
    assert (
        spec.with_overrides({"codec": "jpeg-444", "level": 90}).image_config()[1]["quality"] == 90
    )
    with pytest.raises(SchemaError, match="level 101"):
        spec.with_overrides({"codec": "jpeg-444", "level": 101})


def write(path, shape, seeds, layout=None):
    """Episodes of frames ``frames(5, shape, seed)`` for each seed, in one writer session."""
    eps = [frames(5, shape, seed=s) for s in seeds]
    with episode_buffer(10_000, path=path, layout=layout) as rb:
        for px in eps:
            rb.write_episode(
                {"pixels": px, "reward": np.zeros(5, np.float32), "terminated": np.arange(5) == 4}
            )
    return eps


@pytest.mark.parametrize("shape", [(24, 20, 3), (24, 20, 1)])
def test_a_buffer_records_reopens_appends_and_verifies_jpeg_444(tmp_path, shape):
    path = tmp_path / "b"
    write(path, shape, (0, 1), {"pixels": {"codec": "jpeg-444"}})
    chain = pixel_codec(path)
    assert chain[0] == {"name": "zreplay.jpeg", "configuration": JPEG_444}
    first = zreplay.open(path).episode(0)["pixels"]
    (added,) = write(path, shape, (9,))  # reopened without a layout: the recorded one
    assert pixel_codec(path)[0] == chain[0]
    view = zreplay.open(path, seed=0)
    assert view.num_episodes == 3
    codec = FrameCodec("jpeg", JPEG_444, (len(added), *shape))
    assert np.array_equal(view.episode(2)["pixels"], codec.decode(codec.encode(added)))
    assert np.array_equal(view.episode(0)["pixels"], first)
    assert view.sample(16)["pixels"].shape == (16, *shape)
    assert zreplay.verify(path).ok


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda c: c["configuration"].update(subsampling="422"), "subsampling"),
        (lambda c: c["configuration"].update(subsampling=444), "subsampling"),
        (lambda c: c["configuration"].update(optimize=1), "optimize"),
        (lambda c: c["configuration"].update(optimize="yes"), "optimize"),
        (lambda c: c["configuration"].update(smoothing=0), "parameters"),
        (lambda c: c["configuration"].pop("quality"), "parameters"),
    ],
)
def test_crafted_jpeg_parameters_are_refused_at_open(tmp_path, edit, match):
    write_episodes(tmp_path / "b", "jpeg-444")
    edit_codec(tmp_path / "b", lambda c, _m: edit(c))
    with pytest.raises(CorruptBufferError, match=match):
        zreplay.open(tmp_path / "b").episode(0)


def test_jpeg_written_without_the_new_parameters_still_reads(tmp_path):
    eps = write_episodes(tmp_path / "b", "jpeg", (24, 20, 1))
    assert pixel_codec(tmp_path / "b")[0]["configuration"] == {"quality": 90}
    got = zreplay.open(tmp_path / "b").episode(1)["pixels"]
    assert psnr(got, eps[1]["pixels"]) > 30


def test_plain_zarr_reads_jpeg_444_in_a_fresh_process_without_warnings(tmp_path):
    site = entry_point_site(tmp_path)
    src = ROOT / "src"
    for shape in ((24, 20, 3), (24, 20, 1)):
        path = tmp_path / f"c{shape[-1]}"
        write_episodes(path, "jpeg-444", shape)
        view = zreplay.open(path)
        want = np.concatenate([view.episode(i)["pixels"] for i in range(3)])
        out = run_plain_zarr(PLAIN_READ.format(path=str(path), allow_zreplay=True), [site, src])
        assert out.returncode == 0, out.stderr
        size = "x".join(map(str, (18, *shape)))
        assert out.stdout.split() == ["uint8", size, str(int(want.sum()))]


def test_the_bench_reports_the_lossy_frontier_and_whether_all_three_targets_are_met():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_frames as bf

    fam = [
        bf.Candidate(n, False, None, None, family=f, setting=q)
        for n, f, q in (("A q1", "A", 1), ("A q2", "A", 2), ("B q1", "B", 1), ("B q2", "B", 2))
    ]

    def r(raw, db, ms):
        return {"over_raw": raw, "bytes_per_frame": raw, "psnr_db": db, "decode_ms_1t": 2 * ms}

    results = {
        "photo-224x224": {
            "A q1": r(0.08, 39.0, 0.2) | {"decode_ms_1t_min": 0.2},  # small, below 40 dB
            "A q2": r(0.15, 40.5, 0.4) | {"decode_ms_1t_min": 0.4},  # fast, too big
            "B q1": r(0.09, 40.2, 2.0) | {"decode_ms_1t_min": 2.0},  # small, too slow
            "B q2": r(0.12, 41.0, 3.0) | {"decode_ms_1t_min": 3.0},
        },
        "photo-448x448": {  # four times the pixels: four times the decode budget
            "A q2": r(0.09, 40.1, 3.9) | {"decode_ms_1t_min": 3.9},
        },
    }
    shapes = {"photo-224x224": (224, 224, 3), "photo-448x448": (448, 448, 3)}
    got = bf.lossy_frontier(results, fam, shapes)
    f = got["photo-224x224"]
    assert f["decode_budget_ms"] == 1.0 and f["met"] is False
    assert f["families"]["A"]["candidate"] == "A q2"
    assert f["families"]["A"]["targets"] == {"bytes": False, "psnr": True, "decode": True}
    assert f["families"]["B"]["candidate"] == "B q1" and not f["families"]["B"]["all_three"]
    assert f["fewest_bytes_within_decode"]["candidate"] == "A q2"
    assert f["fastest_decode_within_bytes"]["candidate"] == "B q1"
    g = got["photo-448x448"]
    assert g["decode_budget_ms"] == 4.0 and g["met"] is True
    assert g["families"]["A"]["all_three"] and g["families"]["B"] is None
    table = bf.frontier_markdown(got)
    assert "**all three**" in table and "| all three met | False | True |" in table


@pytest.mark.parametrize("codec", LOSSY_IMAGE_CODECS)
def test_a_lossy_codec_stores_one_frame_per_chunk(codec):
    # 8x8 grey frames would get hundreds of rows a chunk; a chunk of several lossy frames
    # would be decoded and re-encoded when a reopened writer appends to it
    spec = KeyLayout.default(KeySpec("pixels", np.dtype(np.uint8), (8, 8, 3)))
    assert spec.chunk_rows > 1
    lay = spec.with_overrides({"codec": codec})
    assert lay.chunk_rows == 1 and lay.shard_rows % 1 == 0
    assert spec.with_overrides({"codec": codec, "chunk_rows": 1}).chunk_rows == 1
    # named, as a buffer made before this rule may have recorded it: kept
    assert spec.with_overrides({"codec": codec, "chunk_rows": 4}).chunk_rows == 4
    assert spec.with_overrides({"codec": "rowdiff", "chunk_rows": 4}).chunk_rows == 4


def test_appending_after_a_reopen_leaves_earlier_lossy_frames_as_they_were(tmp_path):
    path = tmp_path / "b"
    shape = (20, 20, 3)  # small frames: without the rule, many frames a chunk
    write(path, shape, (0, 1), {"pixels": {"codec": "jpeg"}})
    before = [zreplay.open(path).episode(i)["pixels"] for i in range(2)]
    write(path, shape, (9,))  # reopened: appends after the partly filled last chunk
    view = zreplay.open(path)
    assert view.num_episodes == 3
    for i, px in enumerate(before):
        assert np.array_equal(view.episode(i)["pixels"], px)
