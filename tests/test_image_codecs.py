"""Image codecs for camera frames (store/imagecodec.py): every codec round-trips every
frame shape it takes (lossless bit for bit, lossy above a PSNR floor), refuses the others
before anything is written, is recorded in the array's zarr.json and read back from it
(local files and S3, by zreplay's shard reader; by plain zarr in a fresh process through
the entry points pyproject.toml declares), reports damaged frames through verify, and
refuses crafted codec metadata."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import numpy as np
import pytest

import zreplay
from zreplay import CorruptBufferError, SchemaError
from zreplay.store.imagecodec import FrameCodec, ImageCodecError
from zreplay.store.layout import IMAGE_CODECS, KeyLayout

ROOT = Path(__file__).resolve().parents[1]
LOSSLESS = ("png", "webp", "jpegxl", "qoi")
LOSSY = ("webp-lossy", "jpegxl-lossy", "avif", "jpeg")
SHAPES = [(17, 13), (17, 13, 1), (16, 21, 3), (19, 17, 4)]


def frames(n: int, shape: tuple, seed: int = 0) -> np.ndarray:
    """``n`` camera-like uint8 frames: a smooth scene panning, with sensor noise."""
    rng = np.random.default_rng(seed)
    h, w = shape[:2]
    c = shape[2] if len(shape) == 3 else 1
    y, x = np.mgrid[0:h, 0:w]
    out = []
    for i in range(n):
        planes = [128 + 90 * np.sin((x + 2 * i) / 5.0 + k) * np.cos(y / 7.0) for k in range(c)]
        img = np.stack(planes, -1) + rng.normal(0, 2, (h, w, c))
        out.append(np.clip(img, 0, 255).round().astype(np.uint8).reshape(shape))
    return np.stack(out)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b) ** 2)
    return 99.0 if mse == 0 else 10 * np.log10(255**2 / mse)


def codec_for(name: str, chunk_shape: tuple) -> FrameCodec:
    fmt, config = KeyLayout(
        chunk_shape[0], chunk_shape[0], name, IMAGE_CODECS[name][2]
    ).image_config()
    return FrameCodec(fmt, config, chunk_shape)


def takes(name: str, shape: tuple) -> bool:
    channels = 1 if len(shape) == 2 else shape[2]
    return channels in {"webp": (3, 4), "webp-lossy": (3, 4), "qoi": (3, 4), "jpeg": (1, 3)}.get(
        name, (1, 3, 4)
    )


@pytest.mark.parametrize("name", LOSSLESS + LOSSY)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rows", [1, 3])
def test_every_codec_round_trips_every_shape_it_takes(name, shape, rows):
    if not takes(name, shape):
        with pytest.raises(ImageCodecError, match="channels"):
            codec_for(name, (rows, *shape))
        return
    codec = codec_for(name, (rows, *shape))
    block = frames(rows, shape)
    body = codec.encode(block)
    got = codec.decode(body)
    assert got.shape == block.shape and got.dtype == np.uint8
    if name in LOSSLESS:
        assert np.array_equal(got, block)
    else:
        assert psnr(got, block) > 28, psnr(got, block)  # tiny odd frames: a loose floor


@pytest.mark.parametrize("name", LOSSY)
def test_lossy_codecs_keep_camera_frames_above_35_db(name):
    block = frames(2, (64, 64, 3))
    codec = codec_for(name, block.shape)
    body = codec.encode(block)
    assert psnr(codec.decode(body), block) >= 35
    assert len(body) < block.nbytes / 2


@contextlib.contextmanager
def episode_buffer(capacity: int, **kwargs):
    """A ReplayBuffer closed at the end (its own ``with`` only commits)."""
    rb = zreplay.ReplayBuffer(capacity, **kwargs)
    try:
        with rb:
            yield rb
    finally:
        rb.close()


def write_episodes(path, codec: str | None, shape=(24, 20, 3), n=3, **kwargs):
    layout = None if codec is None else {"pixels": {"codec": codec}}
    eps = []
    with episode_buffer(10_000, path=path, layout=layout, **kwargs) as rb:
        for i in range(n):
            L = 5 + i
            ep = {
                "pixels": frames(L, shape, seed=i),
                "reward": np.arange(L, dtype=np.float32) + 100 * i,
                "terminated": np.arange(L) == L - 1,
            }
            rb.write_episode(ep)
            eps.append(ep)
    return eps


def pixel_codec(path, writer="default") -> dict:
    meta = json.loads((Path(path) / f"segments/{writer}/data/pixels/zarr.json").read_text())
    return meta["codecs"][0]["configuration"]["codecs"]


@pytest.mark.parametrize("name", LOSSLESS + LOSSY)
def test_a_buffer_stores_reads_and_verifies_each_codec(tmp_path, name):
    shape = (24, 20, 1) if name == "jpeg" else (24, 20, 3)
    eps = write_episodes(tmp_path / "b", name, shape)
    chain = pixel_codec(tmp_path / "b")
    assert chain[0]["name"] == "zreplay." + IMAGE_CODECS[name][0] and chain[1]["name"] == "crc32c"
    view = zreplay.open(tmp_path / "b", seed=0)  # rows from disk: no RAM tier in a view
    want = np.concatenate([e["pixels"] for e in eps])
    got = view.episode(0)["pixels"], view.episode(2)["pixels"]
    for g, e in zip(got, (eps[0], eps[2]), strict=True):
        if name in LOSSLESS:
            assert np.array_equal(g, e["pixels"])
        else:
            assert psnr(g, e["pixels"]) > 30
    batch = view.sample(32)
    assert batch["pixels"].shape == (32, *shape) and len(want) == 18
    assert zreplay.verify(tmp_path / "b").ok


def test_uint8_images_default_to_rowdiff_and_zstd_when_a_layout_says_so(tmp_path):
    """Image-like frames are zreplay.rowdiff by default (store/layout.py says why), zstd
    over raw pixels where a layout names it."""
    eps = write_episodes(tmp_path / "d", None)
    assert [c["name"] for c in pixel_codec(tmp_path / "d")] == ["zreplay.rowdiff", "crc32c"]
    assert np.array_equal(zreplay.open(tmp_path / "d").episode(1)["pixels"], eps[1]["pixels"])
    eps = write_episodes(tmp_path / "z", "zstd")
    assert [c["name"] for c in pixel_codec(tmp_path / "z")] == ["bytes", "zstd", "crc32c"]
    assert np.array_equal(zreplay.open(tmp_path / "z").episode(1)["pixels"], eps[1]["pixels"])


def test_a_default_image_codec_applies_to_image_like_keys(tmp_path, monkeypatch):
    """The mechanism the default will use: image-like uint8 keys (one channel: PNG), not
    small frames."""
    from zreplay.store import layout

    monkeypatch.setattr(layout, "DEFAULT_IMAGE_CODEC", "webp")
    eps = write_episodes(tmp_path / "b", None)
    assert pixel_codec(tmp_path / "b")[0]["name"] == "zreplay.webp"
    assert np.array_equal(zreplay.open(tmp_path / "b").episode(1)["pixels"], eps[1]["pixels"])
    write_episodes(tmp_path / "g", None, shape=(24, 20))
    assert pixel_codec(tmp_path / "g")[0]["name"] == "zreplay.png"
    write_episodes(tmp_path / "s", None, shape=(8, 8, 3))  # too small to be a camera frame
    assert [c["name"] for c in pixel_codec(tmp_path / "s")] == ["bytes", "zstd", "crc32c"]


@pytest.mark.parametrize(
    "codec, shape, dtype, match",
    [
        ("png", (24, 20, 3), np.float32, "uint8"),
        ("webp", (24, 20), np.uint8, "channels"),
        ("jpeg", (24, 20, 4), np.uint8, "channels"),
        ("jpegxl", (24, 20, 2), np.uint8, "codec 'zstd'"),
        ("jpegxl", (24,), np.uint8, "uint8 frames"),
    ],
)
def test_refused_inputs_fail_before_anything_is_written(tmp_path, codec, shape, dtype, match):
    with pytest.raises(SchemaError, match=match):
        with episode_buffer(100, path=tmp_path / "b", layout={"pixels": {"codec": codec}}) as rb:
            rb.write_episode(
                {"pixels": np.zeros((4, *shape), dtype), "terminated": np.arange(4) == 3}
            )
    segs = tmp_path / "b" / "segments"
    assert not any(segs.rglob("c.*")) if segs.exists() else True


def test_level_out_of_range_and_unknown_codec_are_refused():
    spec = KeyLayout(1, 64, "zstd", 1)
    with pytest.raises(SchemaError, match="level"):
        spec.with_overrides({"codec": "jpeg", "level": 0})
    with pytest.raises(SchemaError, match="not one of"):
        spec.with_overrides({"codec": "gif"})
    assert spec.with_overrides({"codec": "jpeg"}).level == 90  # the codec's own default


def shard_of(path) -> Path:
    return next((Path(path) / "segments/default/data/pixels").glob("c.*"))


@pytest.mark.parametrize("codec", ["jpegxl", "jpeg-444"])
def test_verify_reports_damaged_frame_bytes(tmp_path, codec):
    write_episodes(tmp_path / "b", codec)
    shard = shard_of(tmp_path / "b")
    raw = bytearray(shard.read_bytes())
    raw[40] ^= 0xFF  # inside the first frame
    shard.write_bytes(bytes(raw))
    report = zreplay.verify(tmp_path / "b")
    assert not report.ok and "pixels" in str(report)


def test_a_chunk_whose_frames_do_not_add_up_is_refused():
    codec = codec_for("png", (2, 16, 16, 3))
    body = bytearray(codec.encode(frames(2, (16, 16, 3))))
    with pytest.raises(ImageCodecError, match="header"):
        codec.decode(bytes(body[:3]))
    body[4] += 1  # first frame one byte longer than stored
    with pytest.raises(ImageCodecError, match="frames of"):
        codec.decode(bytes(body))
    bigger = codec_for("png", (1, 32, 32, 3)).encode(frames(1, (32, 32, 3)))
    one = codec_for("png", (1, 16, 16, 3))
    with pytest.raises(ImageCodecError, match="does not decode"):
        one.decode(bigger)  # a frame declaring more pixels than the array's frame shape


def edit_codec(path, edit) -> None:
    f = Path(path) / "segments/default/data/pixels/zarr.json"
    meta = json.loads(f.read_text())
    edit(meta["codecs"][0]["configuration"]["codecs"][0], meta)
    f.write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda c, m: c["configuration"].update(bogus=1), "parameters"),
        (lambda c, m: c["configuration"].update(effort=99), "effort"),
        (lambda c, m: c["configuration"].pop("effort"), "parameters"),
        (lambda c, m: c.update(configuration="x"), "not an object"),
        (lambda c, m: c.update(name="zreplay.gif"), "unknown image codec"),
    ],
)
def test_crafted_codec_metadata_is_refused_clearly(tmp_path, edit, match):
    write_episodes(tmp_path / "b", "jpegxl")
    edit_codec(tmp_path / "b", edit)
    with pytest.raises(CorruptBufferError, match=match):
        zreplay.open(tmp_path / "b").episode(0)


def test_huge_declared_frames_are_refused_before_allocating(tmp_path):
    with pytest.raises(ImageCodecError, match="sides"):
        FrameCodec("png", {"level": 1}, (1, 1 << 20, 1 << 20, 3))
    with pytest.raises(ImageCodecError, match="rows"):
        FrameCodec("png", {"level": 1}, (1 << 30, 16, 16, 3))


def entry_point_site(tmp_path) -> Path:
    """A site directory declaring the ``zarr.codecs`` entry points pyproject.toml declares
    (as an installed zreplay's dist-info does)."""
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    site = tmp_path / "site"
    dist = site / "zreplay_codecs_probe-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: zreplay-codecs-probe\nVersion: 0\n"
    )
    lines = ["[zarr.codecs]"] + [f"{k} = {v}" for k, v in eps["zarr.codecs"].items()]
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return site


def run_plain_zarr(code: str, pythonpath: list) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, pythonpath)))
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


PLAIN_READ = """
    import sys, zarr, numpy as np
    g = zarr.open_group({path!r}, mode="r")
    a = g["segments/default/data/pixels"]
    assert "zreplay" not in sys.modules or {allow_zreplay}, "zreplay was imported up front"
    print(a.dtype, "x".join(map(str, a.shape)), int(np.asarray(a[:]).sum()))
"""


def test_plain_zarr_reads_every_codec_in_a_fresh_process_without_warnings(tmp_path):
    site = entry_point_site(tmp_path)
    src = ROOT / "src"
    for name in ("png", "webp", "jpegxl", "qoi", "avif", "jpeg"):
        shape = (24, 20, 1) if name == "jpeg" else (24, 20, 3)
        eps = write_episodes(tmp_path / name, name, shape)
        view = zreplay.open(tmp_path / name)
        want = np.concatenate([view.episode(i)["pixels"] for i in range(3)])
        code = PLAIN_READ.format(path=str(tmp_path / name), allow_zreplay=True)
        out = run_plain_zarr(code, [site, src])
        assert out.returncode == 0, out.stderr
        size = "x".join(map(str, (18, *shape)))
        assert out.stdout.split() == ["uint8", size, str(int(want.sum()))], name
        assert len(eps) == 3


# Where zreplay is installed its entry points are there too: hide them (before zarr
# reads them) to be a reader without zreplay.
WITHOUT_ZREPLAY = """
    import importlib.metadata as md
    _all = md.entry_points
    class _Others:
        groups = _all().groups
        def select(self, **kw):
            return md.EntryPoints(e for e in _all(**kw) if not e.value.startswith("zreplay"))
    md.entry_points = lambda **kw: _Others().select(**kw) if kw else _Others()
"""


def test_a_reader_without_the_codecs_gets_a_clear_error(tmp_path):
    write_episodes(tmp_path / "b", "jpegxl")
    code = WITHOUT_ZREPLAY + PLAIN_READ.format(path=str(tmp_path / "b"), allow_zreplay=False)
    out = run_plain_zarr(code, [])  # no zreplay, no entry points: plain zarr alone
    assert out.returncode != 0
    assert "zreplay.jpegxl" in out.stderr and "UnknownCodecError" in out.stderr


def test_a_buffer_with_image_codecs_samples_reopens_checkpoints_and_evicts(tmp_path):
    path = tmp_path / "b"
    rng = np.random.default_rng(0)
    shots = {}
    with episode_buffer(60, path=path, layout={"pixels": {"codec": "png"}}) as rb:
        for i in range(12):
            L = int(rng.integers(6, 12))
            ep = {
                "pixels": frames(L, (24, 20, 3), seed=i),
                "reward": np.full(L, i, np.float32),
                "terminated": np.arange(L) == L - 1,
            }
            shots[i] = ep["pixels"]
            rb.write_episode(ep)
    view = zreplay.open(path, seed=1)
    assert view.num_rows <= 60
    batch = view.sample(64)
    ids = batch["reward"].astype(int)
    assert ids.min() > 0  # the oldest episodes were evicted
    for e in range(view.num_episodes):
        ep = view.episode(e)
        i = int(ep["reward"][0])
        assert np.array_equal(ep["pixels"], shots[i])
    tr = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path / "t"))
    tr.load_checkpoint(str(path))
    assert len(tr) == view.num_trajectories
    tr.save_checkpoint(str(tmp_path / "ckpt"))
    tr.close()
    again = zreplay.open(tmp_path / "ckpt")
    assert again.num_rows == view.num_rows
    metas = list((tmp_path / "ckpt").glob("segments/*/data/pixels/zarr.json"))
    assert metas and all('"zreplay.png"' in m.read_text() for m in metas)
    assert zreplay.verify(tmp_path / "ckpt").ok


def test_s3_reads_and_writes_an_image_codec_key(url, s3):
    eps = []
    with episode_buffer(
        1000, path=url, storage_options=s3, layout={"pixels": {"codec": "jpegxl"}}
    ) as rb:
        for i in range(3):
            ep = {
                "pixels": frames(5 + i, (24, 20, 3), seed=i),
                "terminated": np.arange(5 + i) == 4 + i,
            }
            rb.write_episode(ep)
            eps.append(ep)
    view = zreplay.open(url, storage_options=s3, seed=0)
    for i, ep in enumerate(eps):
        assert np.array_equal(view.episode(i)["pixels"], ep["pixels"])
    assert view.sample(16)["pixels"].shape == (16, 24, 20, 3)
    assert zreplay.verify(url, storage_options=s3).ok


def test_info_shows_each_keys_codec_and_bytes_per_row(tmp_path, capsys):
    from zreplay.cli import main

    write_episodes(tmp_path / "b", "jpegxl")
    assert main(["info", str(tmp_path / "b"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    px = info["keys"]["pixels"]
    assert px["codec"] == "jpegxl level 2"
    assert px["disk_bytes_per_row"] == round(px["disk_bytes"] / info["rows"], 1)
    assert 0 < px["disk_bytes_per_row"] < 24 * 20 * 3  # compressed
    assert main(["info", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "per row" in out and "jpegxl level 2" in out


def test_a_view_follows_a_clear_of_an_image_key(tmp_path):
    """A view that read frames before a clear (its shard reader caches shard indexes)
    reads the new frames after it, not the old ones at the same offsets."""
    path = tmp_path / "b"
    rng = np.random.default_rng(0)

    def ep(L):
        pixels = rng.integers(0, 255, (L, 24, 20, 3), dtype=np.uint8)
        return {"pixels": pixels, "terminated": np.arange(L) == L - 1}

    with episode_buffer(1000, path=path, layout={"pixels": {"codec": "png"}}) as rb:
        for _ in range(3):
            rb.write_episode(ep(7))
        rb.flush()
        view = zreplay.open(path)
        assert view.num_rows == 21 and view.episode(0)["pixels"].shape == (7, 24, 20, 3)
        rb.clear()
        new = [ep(5) for _ in range(2)]
        for e in new:
            rb.write_episode(e)
    view.refresh()
    assert view.num_rows == 10
    for i, e in enumerate(new):
        assert np.array_equal(view.episode(i)["pixels"], e["pixels"])
    assert zreplay.verify(path).ok
