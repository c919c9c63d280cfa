"""Safety edges of image-codec arrays (issue 36): a codec missing where the buffer is read
is reported as such (MissingCodecError naming the array, codec and fix; verify: "cannot
check", never damage), adds and samples of an image key are all or nothing under an
error, a Ctrl-C or a kill at every store call, the shard reader refuses files swapped
after open (links, FIFOs, indexes pointing past the file) before reading or allocating,
and ``zreplay upgrade --codec`` works on S3 all or nothing."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import threading
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import processes, shard_files
from faultlib import Faults, Interrupts, budget, injection_points, sweep_faults, sweep_kills

import zreplay
from zreplay import CorruptBufferError, MissingCodecError
from zreplay.cli import main as cli
from zreplay.errors import ZReplayError
from zreplay.store.imagecodec import FrameCodec
from zreplay.store.recode import recode

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


# -- 2. faults over adds to an image-codec key ----------------------------------------


def test_the_harness_sees_image_shard_writes_of_a_writer_opened_before_it(tmp_path):
    """The shard writer looks up the backend's publish at each write: a harness installed
    after the array was opened still sees (and can fail) the image shards' writes."""
    path = tmp_path / "b"
    rb = zreplay.ReplayBuffer(10_000, path=path, layout={"pixels": {"codec": "png"}})
    try:
        rb.write_episode(episode(0))
        rb.flush()
        counter = Faults()
        with counter.installed():
            rb.write_episode(episode(1))
            rb.flush()
        assert "LocalBackend.publish" in counter.names, counter.names
        with Faults(1, "error").installed() as faults:
            rb.write_episode(episode(2))
            with pytest.raises(zreplay.WriteFailedError):
                rb.flush()
        assert faults.fired and "publish" in faults.fired
    finally:
        rb.close()
    assert zreplay.verify(path).ok and len(pixels(path)) == 5 + 6 + 7


class CtrlC(Interrupts):
    """A Ctrl-C at the armed call where Python delivers one: in the main thread; a
    background thread (the writer's preload, its committer) gets the I/O error there."""

    def hit(self, name: str) -> None:
        if threading.current_thread() is threading.main_thread():
            super().hit(name)
        else:
            Faults.hit(self, name)


def add_flush_sample(path: str) -> None:
    """The operation swept: a writer adds an episode to the image key and flushes, then a
    view samples it from disk."""
    rb = zreplay.ReplayBuffer(10_000, path=path)
    try:
        rb.write_episode(episode(2))
        rb.flush()
    finally:
        rb.close()
    view = zreplay.open(path, seed=0)
    assert view.sample(8)["pixels"].shape == (8, *SHAPE)


def before_or_after(path, states: dict) -> str:
    """Which of ``states`` (name -> pixels) the buffer at ``path`` holds, read by zreplay
    and by plain zarr, with verify clean and no lock held (a writer opens it)."""
    import zarr

    assert zreplay.verify(path).ok, str(zreplay.verify(path))
    got = pixels(path)
    # Nothing held: the lock is free.  Opening a writer also cuts arrays a writer killed
    # with a commit in flight left longer back to the commit (FORMAT.md, "Array lengths"),
    # after which plain zarr shows exactly the committed rows.
    zreplay.ReplayBuffer(10_000, path=path).close()
    plain = zarr.open_group(str(path), mode="r")["segments/default/data/pixels"]
    assert np.array_equal(np.asarray(plain[:]), got)
    for name, want in states.items():
        if got.shape == want.shape and np.array_equal(got, want):
            return name
    raise AssertionError(f"{len(got)} rows: neither state")


def counted_add(tmp_path) -> tuple[Path, dict, Faults]:
    template = tmp_path / "template"
    eps = make_buffer(template, "png", n=2)
    before = np.concatenate([e["pixels"] for e in eps])
    after = np.concatenate([before, episode(2)["pixels"]])
    work = tmp_path / "count"
    shutil.copytree(template, work)
    counter = Faults()
    with counter.installed():
        add_flush_sample(str(work))
    assert before_or_after(work, {"after": after}) == "after"
    return template, {"before": before, "after": after}, counter


@pytest.mark.parametrize("mode", ["error", "interrupt"])
def test_an_add_to_an_image_key_is_all_or_nothing_under_errors_and_ctrl_c(tmp_path, mode):
    template, states, counter = counted_add(tmp_path)
    writes = [n for n in counter.names if n == "LocalBackend.publish"]
    assert len(writes) >= 3  # the image shard's, the other keys', the commit's
    points = injection_points(
        counter.calls, budget(10), seed=zlib.crc32(b"image add " + mode.encode())
    )
    # every image shard write is among the points: they are what this sweep is for
    points = sorted(
        {*points, *(i + 1 for i, n in enumerate(counter.names) if n == "LocalBackend.publish")}
    )
    seen = {"before": 0, "after": 0}
    sweep_faults(
        template,
        tmp_path,
        points,
        lambda at: (Faults if mode == "error" else CtrlC)(at, "error"),
        lambda path: add_flush_sample(str(path)),
        lambda path: before_or_after(path, states),
        seen,
    )
    print(f"\nimage add [{mode}]: {counter.calls} store calls, {len(points)} points, {seen}")
    assert seen["before"] > 0, seen


def _add_in_child(path: str, at: int) -> None:
    with Faults(at, "crash").installed():
        add_flush_sample(path)


@pytest.mark.slow
def test_an_add_to_an_image_key_killed_at_any_store_call_leaves_before_or_after(tmp_path):
    template, states, counter = counted_add(tmp_path)
    seen = {"before": 0, "after": 0}
    points = injection_points(counter.calls, budget(16), seed=zlib.crc32(b"image crash"))
    outcome = lambda path: before_or_after(path, states)  # noqa: E731
    sweep_kills(template, tmp_path, points, processes(), _add_in_child, outcome, seen)
    print(f"\nimage add [crash]: {counter.calls} store calls, {seen}")
    assert seen["before"] > 0 and seen["after"] > 0, seen


# -- 3. shard files swapped after the buffer was opened --------------------------------


def rewrite_index(shard: Path, edit) -> None:
    """Replace ``shard`` with a copy whose index (``uint64 [chunks, 2]``: offset, size)
    ``edit`` changed, its crc32c made valid again (only the numbers lie)."""
    import google_crc32c

    meta = json.loads((shard.parent / "zarr.json").read_text())
    inner = meta["codecs"][0]["configuration"]["chunk_shape"][0]
    n = 16 * (meta["chunk_grid"]["configuration"]["chunk_shape"][0] // inner)
    raw = bytearray(shard.read_bytes())
    index = np.frombuffer(bytes(raw[-n - 4 : -4]), "<u8").reshape(-1, 2).copy()
    edit(index, len(raw))
    body = index.astype("<u8").tobytes()
    raw[-n - 4 :] = body + google_crc32c.value(body).to_bytes(4, "little")
    tmp = shard.with_name("planted")
    tmp.write_bytes(bytes(raw))
    os.replace(tmp, shard)


def plant_fifo(shard: Path, tmp_path) -> None:
    shard.unlink()
    os.mkfifo(shard)
    # Whatever opens it for reading would block until a writer comes: this one comes
    # (and closes at once), so a reader that does not refuse FIFOs reads nothing instead
    # of hanging the test; one that refuses leaves this thread waiting (a daemon).
    threading.Thread(target=lambda: open(shard, "wb").close(), daemon=True).start()


def plant_link_out(shard: Path, tmp_path) -> None:
    outside = tmp_path / "outside"
    shutil.copy(shard, outside)  # a valid shard: a reader following the link reads it
    shard.unlink()
    shard.symlink_to(outside)


def plant_offsets_past_end(shard: Path, tmp_path) -> None:
    rewrite_index(shard, lambda idx, size: idx.__setitem__((0, 0), 1000 * size))


def plant_huge_size(shard: Path, tmp_path) -> None:
    rewrite_index(shard, lambda idx, size: idx.__setitem__((0, 1), 1 << 63))


def plant_aliased_chunk(shard: Path, tmp_path) -> None:
    rewrite_index(shard, lambda idx, size: idx.__setitem__(1, idx[0]))


def plant_sparse_giant(shard: Path, tmp_path) -> None:
    tmp = shard.with_name("planted")
    with open(tmp, "wb") as f:
        f.truncate(2 << 30)  # 2 GiB of zeros, none of them on disk
    os.replace(tmp, shard)


@pytest.mark.parametrize(
    "plant, says",
    [
        (plant_fifo, "not a regular file"),
        (plant_link_out, "symbolic link"),
        (plant_offsets_past_end, "outside"),
        (plant_huge_size, "past any object"),
        (plant_sparse_giant, "more than a shard"),
        (plant_aliased_chunk, "overlap"),
    ],
)
def test_a_shard_swapped_after_open_is_refused_before_reading_or_allocating(tmp_path, plant, says):
    path = tmp_path / "b"
    make_buffer(path)
    view = zreplay.open(path)  # arrays opened; nothing read yet
    (shard,) = shard_files(path, "pixels")
    plant(shard, tmp_path)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptBufferError, match=says) as e:
            view.episode(0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        if shard.is_fifo():  # let the FIFO's waiting writer go
            os.close(os.open(shard, os.O_RDONLY | os.O_NONBLOCK))
    assert str(shard) in str(e.value)
    assert peak < 16 << 20, f"{peak:,} bytes allocated"
    assert not zreplay.verify(path).ok


# -- 4. zreplay upgrade --codec on S3 ---------------------------------------------------


def s3_codec(url, so) -> str:
    from zreplay.store.location import locate

    meta = json.loads((locate(url, so) / "segments/default/data/pixels/zarr.json").read_bytes())
    return meta["codecs"][0]["configuration"]["codecs"][0]["name"]


def s3_state(url, so, want) -> str:
    """``"old"`` (png) or ``"new"`` (jpegxl): the buffer holds every row, by zreplay and
    by plain zarr, and verifies."""
    import zarr

    name = s3_codec(url, so)
    assert name in ("zreplay.png", "zreplay.jpegxl"), name
    assert np.array_equal(pixels(url, storage_options=so), want)
    plain = zarr.open_group(url, mode="r", storage_options=so)["segments/default/data/pixels"]
    assert np.array_equal(np.asarray(plain[:]), want)
    assert zreplay.verify(url, storage_options=so).ok
    return "old" if name == "zreplay.png" else "new"


def test_upgrade_codec_on_s3_through_the_command_line(url, s3):
    eps = make_buffer(url, storage_options=s3)
    want = np.concatenate([e["pixels"] for e in eps])
    env = dict(
        os.environ,
        AWS_ENDPOINT_URL=s3["endpoint_url"],
        AWS_ACCESS_KEY_ID=s3["key"],
        AWS_SECRET_ACCESS_KEY=s3["secret"],
    )
    run = [sys.executable, "-m", "zreplay.cli", "upgrade", url, "--codec", "pixels=jpegxl"]
    out = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "re-encoded pixels: png -> jpegxl" in out.stdout
    assert s3_state(url, s3, want) == "new"


def s3_copy(src: str, dst: str, so) -> None:
    from zreplay.store.location import locate

    a, b = locate(src, so), locate(dst, so)
    for rel, loc in a.backend.walk_files(a):
        a.backend.copy(loc.key, (b / rel).key)


@pytest.mark.parametrize("mode", ["error", "interrupt"])
def test_upgrade_codec_on_s3_is_all_or_nothing_under_errors_and_ctrl_c(url, s3, mode):
    eps = make_buffer(url, storage_options=s3)
    want = np.concatenate([e["pixels"] for e in eps])
    counter = Faults()
    s3_copy(url, url + "-count", s3)
    with counter.installed():
        recode(url + "-count", {"pixels": {"codec": "jpegxl"}}, s3)
    assert s3_state(url + "-count", s3, want) == "new"
    points = injection_points(
        counter.calls, budget(6), seed=zlib.crc32(b"s3 recode " + mode.encode())
    )
    seen = {"old": 0, "new": 0}
    for at in points:
        path = f"{url}-at{at}"
        s3_copy(url, path, s3)
        faults = (Faults if mode == "error" else Interrupts)(at, "error")
        try:
            with faults.installed():
                recode(path, {"pixels": {"codec": "jpegxl"}}, s3)
        except (OSError, ZReplayError) as e:
            assert str(e), "an error without a message"
        except KeyboardInterrupt:
            assert mode == "interrupt"
        assert faults.fired
        try:
            state = s3_state(path, s3, want)
            recode(path, {"pixels": {"codec": "jpegxl"}}, s3)  # still recodes: nothing held
            seen[state] += 1
        except BaseException as err:
            err.add_note(f"after a {mode} at store call {at} of {counter.calls}: {faults.fired}")
            raise
    print(f"\ns3 recode [{mode}]: {counter.calls} store calls, {len(points)} points, {seen}")
    assert seen["old"] > 0, seen


# -- 5. crafted codec metadata and frames ----------------------------------------------


def edit_array(path, key: str, edit) -> None:
    f = Path(path) / f"segments/default/data/{key}/zarr.json"
    meta = json.loads(f.read_text())
    edit(meta)
    f.write_text(json.dumps(meta))


def image_codec(meta) -> dict:
    return meta["codecs"][0]["configuration"]["codecs"][0]


def as_png(meta) -> None:
    meta["codecs"][0]["configuration"]["codecs"] = [
        {"name": "zreplay.png", "configuration": {"level": 3}},
        {"name": "crc32c"},
    ]


@pytest.mark.parametrize(
    "key, edit, says",
    [
        ("pixels", lambda m: image_codec(m)["configuration"].update(level=-1), "level=-1"),
        ("pixels", lambda m: image_codec(m)["configuration"].update(level=10**30), "level="),
        ("pixels", lambda m: image_codec(m)["configuration"].update(level=3.0), "level=3.0"),
        ("pixels", lambda m: image_codec(m)["configuration"].update(level=True), "level=True"),
        ("pixels", lambda m: image_codec(m)["configuration"].update(level="9"), "level='9'"),
        ("pixels", lambda m: image_codec(m).update(name="zreplay."), "unknown image codec"),
        (
            "pixels",
            lambda m: m["codecs"][0]["configuration"]["chunk_shape"].__setitem__(0, 0),
            "cannot read",
        ),
        ("depth", as_png, "got float32 rows"),  # a codec declared on a float array
    ],
)
def test_crafted_codec_metadata_is_damage_named_before_any_read(tmp_path, key, edit, says):
    path = tmp_path / "b"
    rb = zreplay.ReplayBuffer(10_000, path=path, layout={"pixels": {"codec": "png"}})
    try:
        for i in range(2):
            ep = episode(i)
            rb.write_episode({**ep, "depth": ep["pixels"].astype(np.float32) / 255})
    finally:
        rb.close()
    edit_array(path, key, edit)
    with pytest.raises(CorruptBufferError, match=re.escape(says)) as e:
        zreplay.open(path).episode(0)
    assert f"data/{key}" in str(e.value)
    assert not zreplay.verify(path).ok


def test_a_frame_declaring_a_huge_image_is_refused_before_decoding(tmp_path):
    """A PNG frame whose header claims 30000 x 30000 pixels (2.7 GB decoded) inside a
    24 x 20 array: refused by the header check, nothing of that size allocated."""
    import resource
    import struct

    import imagecodecs

    png = bytearray(imagecodecs.png_encode(np.zeros(SHAPE, np.uint8)))
    struct.pack_into(">II", png, 16, 30000, 30000)  # IHDR width, height
    struct.pack_into(">I", png, 29, zlib.crc32(bytes(png[12:29])))  # its chunk crc
    codec = FrameCodec("png", {"level": 1}, (1, *SHAPE))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ValueError, match="30000"):
        codec.decode(struct.pack("<2I", 1, len(png)) + bytes(png))
    grew_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grew_kib < 256 << 10, f"peak memory grew by {grew_kib} KiB"
