"""``zreplay upgrade --codec``: re-encoding a buffer's keys with another codec
(store/recode.py) keeps every row (lossless codecs bit for bit), records the new codec in
the layout and the arrays' metadata, refuses what it cannot do with nothing touched, and
is all or nothing under errors and Ctrl-C at every store call (tests/faultlib.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import processes
from faultlib import Faults, Interrupts, budget, injection_points, sweep_faults, sweep_kills

import zreplay
from zreplay import SchemaError, WriterLockedError
from zreplay.cli import main as cli
from zreplay.store.recode import recode

SHAPE = (24, 20, 3)


def make_buffer(path: Path, codec: str = "png", capacity: int = 10_000) -> None:
    rng = np.random.default_rng(0)
    rb = zreplay.ReplayBuffer(capacity, path=path, layout={"pixels": {"codec": codec}})
    try:
        for i in range(6):
            L = 5 + i
            y, x = np.mgrid[0 : SHAPE[0], 0 : SHAPE[1]]
            scene = 128 + 80 * np.sin((x[..., None] + np.arange(L)[:, None, None, None]) / 4.0)
            noise = rng.normal(0, 2, (L, *SHAPE))
            rb.write_episode(
                {
                    "pixels": np.clip(scene + y[..., None] + noise, 0, 255).astype(np.uint8),
                    "reward": np.full(L, i, np.float32),
                    "terminated": np.arange(L) == L - 1,
                }
            )
    finally:
        rb.close()


def pixels(path) -> np.ndarray:
    view = zreplay.open(path)
    return np.concatenate([view.episode(e)["pixels"] for e in range(view.num_episodes)])


def codec_names(path) -> list[str]:
    metas = sorted(Path(path).glob("segments/*/data/pixels/zarr.json"))
    return [
        json.loads(m.read_text())["codecs"][0]["configuration"]["codecs"][0]["name"] for m in metas
    ]


def files_of(path) -> dict:
    out = {}
    for f in sorted(Path(path).rglob("*")):
        if f.is_file() and not f.name.startswith("writer.lock"):
            out[str(f.relative_to(path))] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def test_recode_lossless_keeps_every_row_and_records_the_codec(tmp_path):
    path = tmp_path / "b"
    make_buffer(path)
    want = pixels(path)
    before = zreplay.open(path).sample(8)  # a view opened before: rows stay the same
    got = recode(path, {"pixels": {"codec": "jpegxl"}})
    assert got["pixels"]["from"]["codec"] == "png" and got["pixels"]["to"]["codec"] == "jpegxl"
    assert codec_names(path) == ["zreplay.jpegxl"]
    assert np.array_equal(pixels(path), want)
    assert zreplay.open(path).root.schema()[1]["pixels"].codec == "jpegxl"
    assert zreplay.verify(path).ok
    assert recode(path, {"pixels": {"codec": "jpegxl"}}) == {}  # nothing to do
    assert before["pixels"].shape == (8, *SHAPE)
    # a writer reopens it and keeps writing with the new codec
    rb = zreplay.ReplayBuffer(10_000, path=path)
    try:
        rb.write_episode(
            {
                "pixels": np.full((4, *SHAPE), 7, np.uint8),
                "reward": np.zeros(4, np.float32),
                "terminated": np.arange(4) == 3,
            }
        )
    finally:
        rb.close()
    assert np.array_equal(pixels(path)[len(want) :], np.full((4, *SHAPE), 7, np.uint8))


def test_recode_to_lossy_and_back_to_zstd_through_the_command_line(tmp_path, capsys):
    path = tmp_path / "b"
    make_buffer(path)
    want = pixels(path)
    assert cli(["upgrade", str(path), "--codec", "pixels=jpeg:95", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["recoded"]["pixels"]["to"] == {
        **out["recoded"]["pixels"]["from"],
        "codec": "jpeg",
        "level": 95,
        "chunk_rows": 1,  # a lossy codec's chunks hold one frame each
    }
    lossy = pixels(path)
    mse = np.mean((lossy.astype(float) - want) ** 2)
    assert 0 < mse and 10 * np.log10(255**2 / mse) > 30
    assert cli(["upgrade", str(path), "--codec", "pixels=zstd:3"]) == 0
    assert "re-encoded pixels: jpeg -> zstd" in capsys.readouterr().out
    assert np.array_equal(pixels(path), lossy)
    names = json.loads(next(path.glob("segments/*/data/pixels/zarr.json")).read_text())
    assert "zstd" in json.dumps(names["codecs"])
    assert zreplay.verify(path).ok


def test_recode_keeps_an_evicted_buffer_readable(tmp_path):
    path = tmp_path / "b"
    make_buffer(path, capacity=30)
    want = pixels(path)
    recode(path, {"pixels": {"codec": "webp"}})
    assert np.array_equal(pixels(path), want) and zreplay.verify(path).ok


def test_recode_refuses_with_nothing_touched(tmp_path):
    path = tmp_path / "b"
    make_buffer(path)
    files = files_of(path)
    with pytest.raises(SchemaError, match="no key"):
        recode(path, {"nope": {"codec": "png"}})
    with pytest.raises(SchemaError, match="uint8"):
        recode(path, {"reward": {"codec": "png"}})
    with pytest.raises(SchemaError, match="not one of"):
        recode(path, {"pixels": {"codec": "gif"}})
    assert cli(["upgrade", str(path), "--codec", "pixels"]) == 1
    assert files_of(path) == files
    rb = zreplay.ReplayBuffer(10_000, path=path)
    try:
        files = files_of(path)
        with pytest.raises(WriterLockedError):
            recode(path, {"pixels": {"codec": "webp"}})
        assert files_of(path) == files
    finally:
        rb.close()


def recoded_or_not(path, want) -> str:
    """``"old"`` or ``"new"``: the buffer holds every row, verifies, and still recodes;
    anything else fails."""
    names = codec_names(path)
    assert names in (["zreplay.png"], ["zreplay.jpegxl"]), names
    assert np.array_equal(pixels(path), want) and zreplay.verify(path).ok
    recode(path, {"pixels": {"codec": "jpegxl"}})
    assert codec_names(path) == ["zreplay.jpegxl"]
    return "old" if names == ["zreplay.png"] else "new"


def counted_recode(tmp_path):
    """A template buffer, its pixels, and the store calls a recode of a copy of it makes
    (a ``Faults`` counter)."""
    template = tmp_path / "template"
    make_buffer(template)
    counter = Faults()
    work = tmp_path / "count"
    shutil.copytree(template, work)
    with counter.installed():
        recode(work, {"pixels": {"codec": "jpegxl"}})
    return template, pixels(template), counter


@pytest.mark.parametrize("mode", ["error", "interrupt"])
def test_recode_is_all_or_nothing_under_errors_and_ctrl_c(tmp_path, mode):
    template, want, counter = counted_recode(tmp_path)
    calls = counter.calls
    points = injection_points(calls, budget(8), seed=zlib.crc32(mode.encode()))
    seen = {"old": 0, "new": 0}
    sweep_faults(
        template,
        tmp_path,
        points,
        lambda at: (Faults if mode == "error" else Interrupts)(at, "error"),
        lambda path: recode(path, {"pixels": {"codec": "jpegxl"}}),
        lambda path: recoded_or_not(path, want),
        seen,
    )
    print(f"\nrecode [{mode}]: {calls} store calls, {len(points)} points, {seen}")
    assert seen["old"] > 0, seen


def _recode_in_child(path: str, at: int) -> None:
    with Faults(at, "crash").installed():
        recode(path, {"pixels": {"codec": "jpegxl"}})


@pytest.mark.slow
def test_a_recode_killed_at_any_store_call_leaves_old_or_new(tmp_path):
    template, want, counter = counted_recode(tmp_path)
    seen = {"old": 0, "new": 0}
    points = injection_points(counter.calls, budget(24), seed=zlib.crc32(b"crash"))
    outcome = lambda path: recoded_or_not(path, want)  # noqa: E731
    sweep_kills(template, tmp_path, points, processes(), _recode_in_child, outcome, seen)
    print(f"\nrecode [crash]: {counter.calls} store calls, {seen}")
    assert seen["old"] > 0, seen
