"""Safety edges of image-codec arrays (issue 36): a codec missing where the buffer is read
is reported as such (MissingCodecError naming the array, codec and fix; verify: "cannot
check", never damage), adds and samples of an image key are all or nothing under an
error, a Ctrl-C or a kill at every store call, the shard reader refuses files swapped
after open (links, FIFOs, indexes pointing past the file) before reading or allocating,
and ``zreplay upgrade --codec`` works on S3 all or nothing."""

from __future__ import annotations

import hashlib
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

import zreplay
from zreplay import CorruptBufferError, MissingCodecError
from zreplay.cli import main as cli
from zreplay.store.imagecodec import FrameCodec

SHAPE = (24, 20, 3)
FIX = "pip install 'imagecodecs>=2026.3.6'"


def frames(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0 : SHAPE[0], 0 : SHAPE[1]]
    scene = 128 + 80 * np.sin((x[..., None] + np.arange(n)[:, None, None, None]) / 4.0)
    return np.clip(scene + y[..., None] + rng.normal(0, 2, (n, *SHAPE)), 0, 255).astype(np.uint8)


def episode(i: int, length: int | None = None) -> dict:
    n = 5 + i if length is None else length
    return {
        "pixels": frames(n, i),
        "reward": np.full(n, i, np.float32),
        "terminated": np.arange(n) == n - 1,
    }


def make_buffer(path, codec: str = "png", n: int = 3, **kwargs) -> list[dict]:
    eps = [episode(i) for i in range(n)]
    rb = zreplay.ReplayBuffer(10_000, path=path, layout={"pixels": {"codec": codec}}, **kwargs)
    try:
        for ep in eps:
            rb.write_episode(ep)
    finally:
        rb.close()
    return eps


def pixels(path, **kwargs) -> np.ndarray:
    view = zreplay.open(path, **kwargs)
    return np.concatenate([view.episode(e)["pixels"] for e in range(view.num_episodes)])


def files_of(path) -> dict:
    return {
        str(f.relative_to(path)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(Path(path).rglob("*"))
        if f.is_file() and not f.name.startswith("writer.lock")
    }


# -- 1. a codec missing where the buffer is read ----------------------------------------


def assert_missing_codec(err: BaseException, codec: str) -> None:
    assert isinstance(err, MissingCodecError) and isinstance(err, ImportError)
    assert not isinstance(err, CorruptBufferError)
    msg = str(err)
    assert "pixels" in msg and f"zreplay.{codec}" in msg and FIX in msg, msg


def test_no_imagecodecs_is_a_missing_codec_at_open_not_damage(tmp_path, monkeypatch, capsys):
    path = tmp_path / "b"
    make_buffer(path)
    files = files_of(path)
    monkeypatch.setitem(sys.modules, "imagecodecs", None)  # `import imagecodecs` fails
    with pytest.raises(ImportError) as e:
        zreplay.open(path)
    assert_missing_codec(e.value, "png")
    with pytest.raises(MissingCodecError):  # a writer too, before it writes anything
        zreplay.ReplayBuffer(10_000, path=path)
    report = zreplay.verify(path)
    assert not report.ok and report.problems == [] and len(report.unchecked) == 1
    assert "missing codec" in report.unchecked[0] and FIX in report.unchecked[0]
    assert "cannot check" in str(report) and "damaged" not in str(report).replace("not damaged", "")
    assert cli(["verify", str(path)]) == 1
    out = capsys.readouterr().out
    assert "cannot check" in out and "problem:" not in out
    assert files_of(path) == files  # nothing written, nothing marked
    monkeypatch.undo()
    assert zreplay.verify(path).ok and len(pixels(path)) == 18


class _NotBuilt:
    available = False


def test_a_build_without_the_format_is_a_missing_codec(tmp_path, monkeypatch):
    import imagecodecs

    path = tmp_path / "b"
    make_buffer(path, "avif")
    monkeypatch.setattr(imagecodecs, "AVIF", _NotBuilt)
    with pytest.raises(MissingCodecError) as e:
        zreplay.open(path)
    assert_missing_codec(e.value, "avif")
    assert "without AVIF" in str(e.value)
    report = zreplay.verify(path)
    assert report.problems == [] and "without AVIF" in report.unchecked[0]


def test_a_decoder_stub_raising_at_read_is_a_missing_codec(tmp_path, monkeypatch):
    """A build whose availability flag says yes but whose decoder is a stub (imagecodecs
    raises DelayedImportError, an ImportError, from a function it lacks): the read says
    the codec is missing; it is not a damaged frame."""
    import imagecodecs

    path = tmp_path / "b"
    make_buffer(path)

    def stub(*args, **kwargs):
        raise imagecodecs.DelayedImportError("png")

    monkeypatch.setattr(imagecodecs, "png_decode", stub)
    view = zreplay.open(path)
    with pytest.raises(MissingCodecError) as e:
        view.episode(0)
    assert "zreplay.png" in str(e.value) and FIX in str(e.value)
    report = zreplay.verify(path)
    assert report.problems == [] and report.unchecked and "pixels" in report.unchecked[0]
    codec = FrameCodec("png", {"level": 1}, (1, *SHAPE))
    with pytest.raises(MissingCodecError):
        codec.decode(codec.encode(frames(1, 0)))


def test_missing_codec_error_crosses_processes():
    err = MissingCodecError("zreplay.avif", "no AVIF", "b/segments/default/data/pixels")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is MissingCodecError and str(back) == str(err) and back.codec == err.codec
