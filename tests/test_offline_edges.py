"""The offline part's edges: a damaged sealed segment is refused alike by a view and by a
writer of another segment (never left out of samples quietly), and ``zreplay verify``
reports it; a segment not yet committed, or an import still building, is no damage."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

import zreplay
from zreplay.errors import CorruptBufferError, SealedSegmentError


def sealed_buffer(p, T=5):
    a = zreplay.ReplayBuffer(100, path=p, writer_id="offline")
    a.write_episode({"x": np.arange(T, dtype=np.float32)})
    a.close()
    zreplay.seal(p, "offline")


def commit_file(p):
    return p / "segments" / "offline" / "zreplay" / "commit.json"


# (name, how the record is damaged, the field the error names)
DAMAGE = [
    ("unreadable", lambda d: "{not json", "unreadable"),
    ("low_row hides every row", lambda d: {**d, "low_row": 2**62, "n_rows": 2**62}, "rows"),
    ("low_row past n_rows", lambda d: {**d, "low_row": 10**12}, "inconsistent"),
    ("gen out of range", lambda d: {**d, "gen": -1}, "gen=-1"),
    ("gen not an int", lambda d: {**d, "gen": "x"}, "'gen'"),
    ("another segment's record", lambda d: {**d, "writer_id": "other"}, "'other'"),
    ("low_traj hides every trajectory", lambda d: {**d, "low_traj": d["n_traj"]}, "starts at row"),
    ("huge n_rows", lambda d: {**d, "n_rows": 2**62}, "needs"),
    ("view_rows", lambda d: {**d, "sampler": {**d["sampler"], "view_rows": -3}}, "view_rows"),
]


@pytest.mark.parametrize("damage", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_a_damaged_sealed_segment_is_refused_alike_by_writer_and_view(tmp_path, damage):
    _, how, field = damage
    p = tmp_path / "b"
    sealed_buffer(p)
    record = json.loads(commit_file(p).read_text())
    out = how(record)
    commit_file(p).write_text(out if isinstance(out, str) else json.dumps(out))
    before = sorted(x.name for x in (p / "segments").iterdir())
    errors = []
    for make in (
        lambda: zreplay.ReplayBuffer(100, path=p, writer_id="online"),
        lambda: zreplay.open(p),
    ):
        with pytest.raises(CorruptBufferError) as e:
            make()
        errors.append(str(e.value))
    for msg in errors:
        assert "segment 'offline'" in msg and field in msg
        assert f"zreplay verify {p}" in msg and "re-import" in msg
    # one validation: the writer says what the view says
    assert errors[0] == errors[1]
    # refused before the writer made anything (no segment "online" beside it)
    assert sorted(x.name for x in (p / "segments").iterdir()) == before
    assert not zreplay.verify(p).ok


def test_a_sealed_segment_emptied_before_sealing_shows_no_rows_and_is_no_damage(tmp_path):
    p = tmp_path / "b"
    a = zreplay.ReplayBuffer(100, path=p, writer_id="offline")
    a.write_episode({"x": np.arange(5, dtype=np.float32)})
    a.clear()
    a.close()
    zreplay.seal(p, "offline")
    b = zreplay.ReplayBuffer(100, path=p, writer_id="online")
    b.write_episode({"x": np.arange(3, dtype=np.float32)})
    assert len(b) == 3
    b.close()
    assert zreplay.open(p).num_rows == 3
    assert zreplay.verify(p).ok


def test_a_segment_before_its_first_commit_is_no_damage(tmp_path):
    """A writer that has joined but not committed yet leaves a segment without a commit
    record: every reader skips it, as before."""
    p = tmp_path / "b"
    sealed_buffer(p)
    joined = p / "segments" / "late"
    joined.mkdir()
    (joined / "zarr.json").write_text((p / "segments" / "offline" / "zarr.json").read_text())
    b = zreplay.ReplayBuffer(100, path=p, writer_id="online")
    b.close()
    assert zreplay.open(p).num_rows == 5
    assert zreplay.verify(p).ok


def test_a_buffer_being_replaced_by_an_import_stays_whole_for_its_readers(tmp_path):
    """An import builds aside: while one replaces a buffer (overwrite=True), a view opened
    on it sees the old buffer whole, never damage, and afterwards the new; a writer is
    told it is being replaced (its segment would go with the old tree)."""
    from test_minari import write_minari

    p = tmp_path / "b"
    sealed_buffer(p)
    write_minari(tmp_path / "ds", [3, 2, 4])
    seen = []

    def mid_import(k):
        if not seen:
            with pytest.raises(zreplay.WriterLockedError, match="is being replaced"):
                zreplay.ReplayBuffer(100, path=p, writer_id="online")
            seen.append(zreplay.open(p).num_rows)

    zreplay.import_minari(tmp_path / "ds", p, overwrite=True, progress=mid_import)
    assert seen == [5]
    assert zreplay.open(p).num_rows == 9
    assert zreplay.verify(p).ok


# -- Ctrl-C in an import ------------------------------------------------------------------


@pytest.fixture
def ctrl_c():
    """Python's own Ctrl-C handler (a process started in the background by a
    non-interactive shell inherits SIGINT ignored), and a way to press it now."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield lambda: os.kill(os.getpid(), signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_while_a_writer_closes_is_raised_with_its_lock_released(tmp_path, ctrl_c):
    """The cause of the held locks (and "writer lock lost" logs) after a Ctrl-C in an
    import's final flush: a SIGINT landing while close() joins the writer's threads cut
    its cleanup short before the lock was released."""
    from zreplay.engine.committer import Committer

    p = tmp_path / "b"
    b = zreplay.ReplayBuffer(100, path=p)
    b.write_episode({"x": np.arange(5, dtype=np.float32)})
    stop = Committer.stop

    def pressed_in_stop(self):
        ctrl_c()
        stop(self)

    with mock.patch.object(Committer, "stop", pressed_in_stop), pytest.raises(KeyboardInterrupt):
        b.close()
    again = zreplay.ReplayBuffer(100, path=p)  # the lock was let go: no WriterLockedError
    assert len(again) == 5
    again.close()


def test_ctrl_c_while_seal_takes_the_lock_is_raised_with_the_lock_released(tmp_path, ctrl_c):
    from zreplay.store.lock import WriterLock

    p = tmp_path / "b"
    b = zreplay.ReplayBuffer(100, path=p, writer_id="offline")
    b.write_episode({"x": np.arange(5, dtype=np.float32)})
    b.close()
    acquire = WriterLock.acquire

    def pressed_while_taken(self, *a, **kw):
        acquire(self, *a, **kw)
        ctrl_c()  # held back until the lock is taken, then raised

    with mock.patch.object(WriterLock, "acquire", pressed_while_taken):
        with pytest.raises(KeyboardInterrupt):
            zreplay.seal(p, "offline")
    zreplay.seal(p, "offline")  # no WriterLockedError: nothing was left held
    with pytest.raises(SealedSegmentError):
        zreplay.ReplayBuffer(100, path=p, writer_id="offline")


def test_a_released_flock_hold_enters_no_deferral_when_collected(tmp_path, monkeypatch):
    """A Ctrl-C held back inside a finalizer is raised there, where Python ignores it:
    the collection of a released Hold (every staging tree and lock leaves one) must not
    hold Ctrl-C back."""
    import contextlib
    import gc

    from zreplay.store import liveness

    entered = []

    @contextlib.contextmanager
    def counted():
        entered.append(1)
        yield

    f = tmp_path / "f"
    f.write_text("")
    h = liveness.hold(f)
    h.release()
    monkeypatch.setattr(liveness, "deferred_interrupts", counted)
    del h
    gc.collect()
    assert entered == []


SWEEP = r"""
import io, json, logging, os, shutil, signal, sys, threading, time
from pathlib import Path
import numpy as np
from lerobot_layout import write_dataset
import zreplay
from zreplay.store import lock as zlock

log = io.StringIO()
logging.getLogger("zreplay").addHandler(logging.StreamHandler(log))
ignored = []  # exceptions Python ignored (raised in a finalizer): a Ctrl-C lost there
sys.unraisablehook = lambda u: ignored.append(repr(u.exc_value))
signal.signal(signal.SIGINT, signal.default_int_handler)
base, budget = Path(sys.argv[1]), float(sys.argv[2])
src = base / "ds"
write_dataset(src, lengths=(3, 4, 5), video=False)
took = []
for _ in range(2):
    t = time.perf_counter()
    zreplay.import_lerobot(src, base / "w")
    took.append(time.perf_counter() - t)
    shutil.rmtree(base / "w")
took = max(took)
rng = np.random.default_rng(0)
end = time.monotonic() + budget
while time.monotonic() < end:
    dst = base / "b"
    delay = float(rng.uniform(0.0, 1.1 * took))
    fired, out = [], {"delay": delay}
    timer = threading.Timer(delay, lambda: (fired.append(time.perf_counter()),
                                            os.kill(os.getpid(), signal.SIGINT)))
    log.seek(0); log.truncate()
    returned = None
    try:
        timer.start()
        zreplay.import_lerobot(src, dst)
        returned = time.perf_counter()
        timer.join()  # a Ctrl-C after the import returned is raised here
        time.sleep(0.05)
        out["outcome"] = "returned"
    except KeyboardInterrupt:
        out["outcome"] = "interrupted" if returned is None else "after"
    finally:
        timer.cancel(); timer.join()
    out["fired_before_return"] = bool(fired) and (returned is None or fired[0] < returned)
    out["dst"] = dst.exists()
    if dst.exists():
        v = zreplay.open(dst)
        out["whole"] = v.num_rows == 12 and zreplay.verify(dst, data=False).ok
    out["left"] = sorted(x.name for x in base.iterdir() if x.name not in ("ds", "b"))
    out["held"] = len(zlock._HELD_HERE)
    out["log"] = log.getvalue()[-300:]
    out["ignored"], ignored[:] = list(ignored), []
    print(json.dumps(out), flush=True)
    shutil.rmtree(dst, ignore_errors=True)
"""


@pytest.mark.slow
def test_real_ctrl_c_anywhere_in_an_import_is_raised_and_leaves_nothing(tmp_path):
    """Real SIGINTs sent at many moments of ``import_lerobot`` (a fresh process, for
    ~35 s): each one surfaces as KeyboardInterrupt (a Ctrl-C after the import returned,
    once the buffer is in place, where the caller is), nothing is left in staging, no
    lock stays held and nothing logs a lost lock; a buffer at dst is always whole."""
    pytest.importorskip("pyarrow")
    tests = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent / "src"), str(tests)])}
    proc = subprocess.run(
        [sys.executable, "-c", SWEEP, str(tmp_path), "35"],
        capture_output=True, text=True, env=env, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [json.loads(line) for line in proc.stdout.splitlines()]
    for r in runs:
        assert not r["left"] and not r["held"] and "lock lost" not in r["log"], r
        assert not r["ignored"], r
        if r["outcome"] == "returned":  # never with a SIGINT sent before it returned
            assert not r["fired_before_return"], r
        if r["outcome"] == "interrupted":
            assert not r["dst"] or r["whole"], r
        if r["outcome"] != "interrupted":
            assert r["dst"] and r["whole"], r
    interrupted = sum(r["outcome"] == "interrupted" for r in runs)
    assert interrupted >= 10 and len(runs) - interrupted >= 1, runs


# -- imports into s3:// -------------------------------------------------------------------


def _s3_objects(s3, url) -> list[str]:
    import s3fs

    fs = s3fs.S3FileSystem(**s3)
    fs.invalidate_cache()
    return fs.find(url.removeprefix("s3://")) if fs.exists(url) else []


def _rows(path, options=None) -> dict:
    v = zreplay.open(path, storage_options=options)
    return v.rows(np.arange(v.num_rows))


def _assert_same(got, want, where="") -> None:
    if isinstance(want, dict):
        assert sorted(got) == sorted(want), where
        for k in want:
            _assert_same(got[k], want[k], f"{where}/{k}")
    else:
        assert got.dtype == want.dtype, where
        np.testing.assert_array_equal(got, want, err_msg=where)


def test_import_lerobot_and_minari_into_s3_arrive_as_locally(tmp_path, s3, url):
    """Both imports write an ``s3://`` destination: the same rows as a local import, a
    verified buffer, and its offline part sampled beside an online writer's rows."""
    pytest.importorskip("pyarrow")
    from lerobot_layout import write_dataset
    from test_minari import write_minari

    write_dataset(tmp_path / "ds", lengths=(3, 4, 5), video=False)
    write_minari(tmp_path / "mds", [3, 2, 4])
    for imp, src, local, there in [
        (zreplay.import_lerobot, tmp_path / "ds", tmp_path / "lr", url),
        (zreplay.import_minari, tmp_path / "mds", tmp_path / "mi", url + "-minari"),
    ]:
        imp(src, local)
        imp(src, there, storage_options=s3)
        _assert_same(_rows(there, s3), _rows(local))
        assert zreplay.verify(there, storage_options=s3).ok
    online = zreplay.ReplayBuffer(100, path=url, writer_id="online", storage_options=s3)
    assert len(online) == 12  # the sealed offline part beside its own (none yet)
    online.close()


def test_a_failing_import_into_s3_leaves_nothing_a_reader_or_writer_sees(tmp_path, s3, url):
    """An error mid-import (here: the third episode's progress) leaves no object at a new
    ``s3://`` destination, and an existing buffer it was to replace as it was."""
    from test_minari import write_minari

    write_minari(tmp_path / "mds", [3, 2, 4])

    def fail_at_third():
        seen = []

        def progress(k):
            seen.append(k)
            if len(seen) == 3:
                raise RuntimeError("injected")

        return progress

    with pytest.raises(RuntimeError, match="injected"):
        zreplay.import_minari(tmp_path / "mds", url, storage_options=s3, progress=fail_at_third())
    assert _s3_objects(s3, url) == []
    with pytest.raises(zreplay.FormatError):
        zreplay.open(url, storage_options=s3)

    write_minari(tmp_path / "small", [4])
    zreplay.import_minari(tmp_path / "small", url, storage_options=s3)
    before = _s3_objects(s3, url)
    for fail in (fail_at_third(), lambda k: (_ for _ in ()).throw(KeyboardInterrupt)):
        with pytest.raises((RuntimeError, KeyboardInterrupt)):
            zreplay.import_minari(
                tmp_path / "mds", url, storage_options=s3, overwrite=True, progress=fail
            )
        assert _s3_objects(s3, url) == before
        assert zreplay.open(url, storage_options=s3).num_rows == 4
        assert zreplay.verify(url, storage_options=s3).ok
    w = zreplay.ReplayBuffer(100, path=url, writer_id="online", storage_options=s3)
    assert len(w) == 4
    w.close()


def test_cli_import_into_s3(tmp_path, s3, url):
    pytest.importorskip("pyarrow")
    from lerobot_layout import write_dataset

    write_dataset(tmp_path / "ds", lengths=(3, 2), video=False)
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"),
        "AWS_ENDPOINT_URL": s3["endpoint_url"],
        "AWS_ACCESS_KEY_ID": s3["key"],
        "AWS_SECRET_ACCESS_KEY": s3["secret"],
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    cmd = [sys.executable, "-m", "zreplay.cli", "import", "--json", "-q"]
    r = subprocess.run([*cmd, str(tmp_path / "ds"), url], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["rows"] == 5
    assert zreplay.open(url, storage_options=s3).num_rows == 5
    assert not any(p.name.startswith("s3") for p in Path.cwd().iterdir())  # no local "s3:"
    r = subprocess.run([*cmd, str(tmp_path / "ds"), url], env=env, capture_output=True, text=True)
    assert r.returncode == 1 and "--overwrite" in r.stdout + r.stderr


# -- LeRobot image features: grayscale and JPEG -------------------------------------------


def _lerobot_items(tmp_path):
    from lerobot_judge import run_judge

    root, items = tmp_path / "ds", tmp_path / "items.npz"
    run_judge("make_image_kinds_dataset.py", root, scratch=tmp_path)
    run_judge("read_lerobot.py", root, items, scratch=tmp_path)
    return root, dict(np.load(items))


def _judged(test):
    from lerobot_judge import needs_judge

    return needs_judge(test)


@_judged
def test_grayscale_png_and_jpeg_images_import_as_lerobot_reads_them(tmp_path):
    """Grayscale PNG cells (what LeRobot's writer stores for PIL "L" frames) and JPEG
    cells (a dataset ported from JPEG frames) import equal to LeRobot's own reader, item
    by item."""
    pytest.importorskip("pyarrow")
    root, items = _lerobot_items(tmp_path)
    zreplay.import_lerobot(root, tmp_path / "buf")
    view = zreplay.open(tmp_path / "buf")
    rows = view.rows(np.arange(view.num_rows))
    for name in ("observation.images.gray", "observation.images.rgb", "action"):
        want = items[name]
        assert rows[name].dtype == want.dtype, name
        np.testing.assert_array_equal(rows[name].reshape(want.shape), want, err_msg=name)
    assert items["observation.images.gray"].shape[1:] == (40, 56, 1)
    assert len(np.unique(items["observation.images.rgb"])) > 50  # real pixels


def test_jpeg_cells_decode_as_pillow_decodes_them(tmp_path):
    """The pixels LeRobot's reader returns for a JPEG cell are Pillow's; FFmpeg's JPEG
    decoder differs in most pixels of a colour frame."""
    pytest.importorskip("pyarrow")
    Image = pytest.importorskip("PIL.Image")
    import io

    import skimage.data

    from zreplay.compat.lerobot_format import Feature
    from zreplay.compat.lerobot_read import decode_image

    for frame in (skimage.data.coffee()[:48, :64], skimage.data.camera()[:40, :56, None]):
        buf = io.BytesIO()
        Image.fromarray(frame.squeeze()).save(buf, format="JPEG", quality=90)
        want = np.asarray(Image.open(io.BytesIO(buf.getvalue()))).reshape(frame.shape)
        feat = Feature("cam", "image", np.dtype(np.uint8), frame.shape)
        np.testing.assert_array_equal(decode_image({"bytes": buf.getvalue()}, feat, "x"), want)
        wrong = Feature("cam", "image", np.dtype(np.uint8), (48, 64, 4))
        with pytest.raises(zreplay.FormatError, match="'cam'"):
            decode_image({"bytes": buf.getvalue()}, wrong, "x")


def test_an_image_feature_without_a_channel_axis_is_refused_naming_it(tmp_path):
    """LeRobot accepts an ``image`` feature declared ``[H, W]`` (PIL frames); the import
    refuses it before writing anything, naming the feature and the shape it reads."""
    pytest.importorskip("pyarrow")
    from lerobot_layout import write_dataset

    src = tmp_path / "ds"
    write_dataset(src, lengths=(2,), video=False)
    info = json.loads((src / "meta/info.json").read_text())
    name = next(k for k, f in info["features"].items() if f["dtype"] == "image")
    info["features"][name]["shape"] = info["features"][name]["shape"][:2]
    (src / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(zreplay.FormatError, match=rf"{name}.*\[height, width, channels\]"):
        zreplay.import_lerobot(src, tmp_path / "buf")
    assert not (tmp_path / "buf").exists()


# -- export of numeric rows of several axes -----------------------------------------------

READ_ND = r"""
import json, sys
import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset

root, out = sys.argv[1], sys.argv[2]
ds = LeRobotDataset("local/zreplay-export", root=root, video_backend="pyav")
items = [ds[i] for i in range(len(ds))]
arrays = {k: np.stack([it[k].numpy() for it in items]) for k in items[0] if k != "task"}
np.savez(out, **arrays)
stats = {k: {s: list(np.shape(v)) for s, v in st.items()} for k, st in ds.meta.stats.items()}
print(json.dumps({"len": len(ds), "stats": stats,
                  "features": {k: f["shape"] for k, f in ds.meta.features.items()}}))
"""


def _nd_episode(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "obs": {"mat": rng.standard_normal((n, 4, 3)).astype(np.float32)},
        "grid": rng.integers(-5, 5, (n, 2, 2, 3)).astype(np.int64),
        "deep": rng.standard_normal((n, 1, 2, 1, 2, 2)).astype(np.float32),
        "action": rng.standard_normal((n, 2)).astype(np.float32),
    }


def _nd_buffer(path, lengths=(5, 7, 3)) -> dict:
    rb = zreplay.ReplayBuffer(1000, path=str(path))
    for i, n in enumerate(lengths):
        rb.write_episode(_nd_episode(n, i))
    rb.close()
    eps = [_nd_episode(n, i) for i, n in enumerate(lengths)]
    return {
        "obs.mat": np.concatenate([e["obs"]["mat"] for e in eps]),
        "grid": np.concatenate([e["grid"] for e in eps]),
        "deep": np.concatenate([e["deep"] for e in eps]),
        "action": np.concatenate([e["action"] for e in eps]),
    }


def test_rows_of_two_to_five_axes_export_with_their_shape_and_stats(tmp_path):
    """A float32 [4, 3] row (and [2, 2, 3], [1, 2, 1, 2, 2]) exports as LeRobot stores it:
    info.json keeps the shape, the parquet column is datasets' ArrayND, the stats reduce
    every axis but the last; importing it back gives the rows exactly."""
    pq = pytest.importorskip("pyarrow.parquet")
    want = _nd_buffer(tmp_path / "buf")
    out = tmp_path / "ds"
    zreplay.export_lerobot(tmp_path / "buf", out, fps=10)
    info = json.loads((out / "meta/info.json").read_text())
    assert info["features"]["obs.mat"]["shape"] == [4, 3]
    assert info["features"]["deep"]["shape"] == [1, 2, 1, 2, 2]
    table = pq.read_table(next((out / "data").rglob("*.parquet")))
    hf = json.loads(table.schema.metadata[b"huggingface"])["info"]["features"]
    assert hf["obs.mat"] == {"shape": [4, 3], "dtype": "float32", "_type": "Array2D"}
    assert hf["deep"]["_type"] == "Array5D"
    stats = json.loads((out / "meta/stats.json").read_text())
    for name, v in want.items():
        flat = v.reshape(-1, v.shape[-1]).astype(np.float64)
        np.testing.assert_allclose(stats[name]["mean"], flat.mean(axis=0), rtol=1e-9)
        np.testing.assert_allclose(stats[name]["max"], flat.max(axis=0))
        assert stats[name]["count"] == [len(v)]
    zreplay.import_lerobot(out, tmp_path / "back")
    back = _rows(tmp_path / "back")
    for name, v in want.items():
        np.testing.assert_array_equal(back[name], v, err_msg=name)


def test_rows_of_six_axes_are_refused_naming_lerobots_limit(tmp_path):
    rb = zreplay.ReplayBuffer(100, path=str(tmp_path / "b"))
    rb.write_episode({"x": np.zeros((3, 1, 1, 1, 1, 1, 2), np.float32)})
    rb.close()
    with pytest.raises(zreplay.SchemaError, match=r"'x'.*at most 5 axes.*Array5D"):
        zreplay.export_lerobot(tmp_path / "b", tmp_path / "out", fps=10)
    assert not (tmp_path / "out").exists()


@_judged
def test_rows_of_several_axes_load_in_lerobot_item_for_item(tmp_path):
    """LeRobot 0.4.4's own LeRobotDataset loads the export: every item's [4, 3] (and
    [2, 2, 3], [1, 2, 1, 2, 2]) row equals the buffer's, with its stats of LeRobot's
    shape."""
    from lerobot_judge import run_judge_source

    pytest.importorskip("pyarrow")
    want = _nd_buffer(tmp_path / "buf")
    zreplay.export_lerobot(tmp_path / "buf", tmp_path / "ds", fps=10)
    out = tmp_path / "items.npz"
    meta = json.loads(
        run_judge_source(READ_ND, tmp_path / "ds", out, scratch=tmp_path).splitlines()[-1]
    )
    got = dict(np.load(out))
    assert meta["len"] == 15
    for name, v in want.items():
        assert meta["features"][name] == list(v.shape[1:])
        assert meta["stats"][name]["mean"] == [v.shape[-1]]
        assert got[name].dtype == v.dtype, name
        np.testing.assert_array_equal(got[name], v, err_msg=name)


_CTRL_C_IN_ROLL_FORWARD = """
import json, os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # (see the test's docstring)
sys.path.insert(0, sys.argv[1])
import zreplay
from zreplay.store import objectswap
mds, url, s3 = sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
rolled, sent = objectswap.roll_forward, []

def roll_with_ctrl_c(dest, name):
    original = dest.backend.import_file

    def import_file(*a, **k):
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)  # as a user pressing Ctrl-C now
        return original(*a, **k)

    dest.backend.import_file = import_file
    return rolled(dest, name)

objectswap.roll_forward = roll_with_ctrl_c
try:
    zreplay.import_minari(mds, url, storage_options=s3)
    print("NOT RAISED", sent)
except KeyboardInterrupt:
    print("RAISED", sent)
"""


def test_a_ctrl_c_while_an_s3_import_rolls_into_place_is_raised_after_it_finishes(
    tmp_path, s3, url
):
    """A real SIGINT delivered while the staged tree is copied into place (the intent is
    published: the import is committed) is raised once the roll forward is done, and
    nothing staged is left for the next open to finish: it used to be raised mid-copy,
    leaving a half-swapped tree that plain Zarr and a bucket listing saw.  Run in a fresh
    interpreter with Ctrl-C's default handler: a test run started in the background of a
    non-interactive shell (``nohup .ci/run &``) ignores SIGINT in every process it starts,
    and zreplay rightly hands a held-back SIGINT to the handler it found (ignoring it)."""
    from test_minari import write_minari

    write_minari(tmp_path / "mds", [3, 2, 4])
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            _CTRL_C_IN_ROLL_FORWARD,
            str(Path(__file__).parent),
            str(tmp_path / "mds"),
            url,
            json.dumps(s3),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.stdout.split()[:2] == ["RAISED", "[True]"], run.stdout + run.stderr
    objects = _s3_objects(s3, url)
    assert not [o for o in objects if "/zreplay/staged-" in o or o.endswith("/swap.json")]
    assert zreplay.open(url, storage_options=s3).num_rows == 9
    assert zreplay.verify(url, storage_options=s3).ok
