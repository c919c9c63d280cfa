"""``zreplay upgrade`` (store/upgrade.py): buffers of formats 2, 3 and 4 are refused on
opening with an error that says to upgrade them, and upgrading gives the same buffer in
format 5, all or nothing under an I/O error, a Ctrl-C or a crash at any store call."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import tarfile
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import S3_BUCKET, check_rows, codes_of, make_traj, processes
from faultlib import Faults, Interrupts, budget, injection_points, sweep_faults, sweep_kills

import zreplay
from zreplay.cli import main as cli
from zreplay.errors import CorruptBufferError, FormatError, WriterLockedError, ZReplayError
from zreplay.samplers import Prioritized
from zreplay.store.commit import read_commit
from zreplay.store.format import FORMAT_VERSION
from zreplay.store.liveness import BOOT_ID, PID_NS
from zreplay.store.location import locate
from zreplay.store.root import BufferRoot

DATA = Path(__file__).parent / "data"
UPGRADE = "zreplay upgrade"


# -- buffers of older formats, made from a format-5 one ---------------------------------


def make_buffer(path, so=None) -> None:
    """Two writers: ``a`` prioritized (its saved priorities and sampler state must
    survive), ``b`` plain, both with episodes that end."""
    opts = {"storage_options": so} if so else {}
    a = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(path), writer_id="a", sampler=Prioritized(), **opts
    )
    a.add_trajectories([make_traj(i, epochs=1) for i in range(3)])
    a.sample(8)
    a.close()
    with zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(path), writer_id="b", **opts
    ) as b:
        b.add_trajectories([make_traj(10 + i) for i in range(2)])


def _edit_json(loc, edit) -> None:
    loc.write_bytes(json.dumps(edit(json.loads(loc.read_bytes()))).encode())


def _set_root_format(root, version: int) -> None:
    def edit(doc):
        doc["attributes"]["zreplay"]["format"] = version
        return doc

    _edit_json(root / "zarr.json", edit)


def as_format_3(path, so=None, segments=("a", "b"), root_too=True) -> None:
    """Commit records without ``contents`` and ``inserted`` (what format 3 wrote)."""
    root = locate(path, so)
    if root_too:
        _set_root_format(root, 3)

    def edit(c):
        c.pop("contents"), c.pop("inserted")
        return {**c, "format": 3}

    for w in segments:
        _edit_json(root / "segments" / w / "zreplay" / "commit.json", edit)


def as_format_4(path, so=None) -> None:
    root = locate(path, so)
    _set_root_format(root, 4)
    for w in ("a", "b"):
        _edit_json(root / "segments" / w / "zreplay" / "commit.json", lambda c: {**c, "format": 4})


def as_format_2(path, so=None, segments=("a", "b"), root_too=True) -> None:
    """zreplay's own files back where format 2 kept them: beside the arrays."""
    path = Path(path)
    if root_too:
        _set_root_format(path, 2)
        os.rename(path / "zreplay" / "writers", path / "writers")
        shutil.rmtree(path / "zreplay")
    for w in segments:
        meta = path / "segments" / w / "zreplay"
        c = json.loads((meta / "commit.json").read_text())
        c.pop("contents"), c.pop("inserted")
        (meta.parent / "commit.json").write_text(json.dumps({**c, "format": 2}))
        shutil.rmtree(meta)


OLD = {2: as_format_2, 3: as_format_3, 4: as_format_4}


# -- what a buffer holds ----------------------------------------------------------------


def observe(path, so=None) -> tuple:
    """What a user of the buffer at ``path`` can tell about it: every trajectory's arrays
    and metadata, episodes, a seeded sample, and each segment's counts and saved
    sampler state (its contents id aside: format 3 had none)."""
    view = zreplay.open(path, seed=1, storage_options=so)
    h = hashlib.sha256()
    for i in range(view.num_trajectories):
        _digest(h, view.trajectory(i))
    root = BufferRoot(path, so)
    kept = ("n_rows", "n_traj", "low_row", "low_traj", "n_pieces", "next_trajectory_id")
    kept += ("next_episode", "writer_number", "sampler", "gen")
    commits = {}
    for w in view.writer_ids:
        c = read_commit(root.segment_dir(w))
        commits[w] = {k: getattr(c, k) for k in kept}
    table = view.episode_table()
    episodes = {k: np.asarray(v).tolist() for k, v in sorted(table.items())}
    sample = codes_of(view.sample(64)).tolist()
    view.close()
    return (
        view.writer_ids,
        h.hexdigest(),
        json.dumps(episodes),
        sample,
        json.dumps(commits, sort_keys=True),
    )


def _digest(h, value, name="") -> None:
    if isinstance(value, dict):
        for k in sorted(value):
            _digest(h, value[k], f"{name}/{k}")
        return
    h.update(name.encode())
    arr = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
    h.update(str(arr.dtype).encode() + repr(arr.shape).encode() + arr.tobytes())


def files_of(path, so=None) -> dict:
    """Every file under a buffer (a directory or a URL) with its bytes' hash; lock files
    aside (a lock taken and given back leaves its ``.guard`` companion), and an object
    store's staged builds (the next replace removes a dead one)."""
    loc = locate(path, so)
    out = {}
    for rel, f in loc.backend.walk_files(loc):
        if not rel.rsplit("/", 1)[-1].startswith("writer.lock") and "/staged-" not in rel:
            out[rel] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def refused_on_opening(path, so=None) -> None:
    """Every way to open the buffer says to upgrade it (and names the path)."""
    kw = {"storage_options": so} if so else {}
    openers = [
        lambda: zreplay.open(path, **kw),
        lambda: zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path), **kw),
        lambda: zreplay.ReplayBuffer(100, path=str(path), **kw),
    ]
    for opener in openers:
        with pytest.raises(FormatError, match=UPGRADE) as e:
            opener()
        assert str(path).rstrip("/") in str(e.value)


# -- the upgrade ------------------------------------------------------------------------


@pytest.mark.parametrize("version", [2, 3, 4])
def test_an_older_buffer_says_to_upgrade_and_upgrades_to_the_same_buffer(tmp_path, version):
    path = tmp_path / "b"
    make_buffer(path)
    before = observe(path)
    actions = path / "segments" / "a" / "data" / "actions" / "zarr.json"
    meta = json.loads(actions.read_text())
    meta["shape"][0] += 40  # preallocated padding, as writers before format 4 left it
    actions.write_text(json.dumps(meta))
    OLD[version](path)
    files = files_of(path)
    refused_on_opening(path)
    from zreplay.torchrl import ZarrStorage

    with pytest.raises(FormatError, match=UPGRADE):
        ZarrStorage(max_size=100, path=str(path))
    report = zreplay.verify(path)
    assert not report.ok and UPGRADE in report.problems[0]
    with zreplay.TrajectoryReplayBuffer() as other, pytest.raises(FormatError, match=UPGRADE):
        other.load_checkpoint(str(path))  # a checkpoint of an older format too
    assert files_of(path) == files  # nothing was touched by any of them

    assert zreplay.upgrade(path) == version
    assert observe(path) == before
    assert zarr.open_group(path, mode="r").attrs["zreplay"]["format"] == FORMAT_VERSION
    assert not (path / "writers").exists() and not (path / "segments/a/commit.json").exists()
    assert sorted(os.listdir(path / "zreplay" / "writers")) == ["0", "1"]  # claims kept
    assert zreplay.verify(path).ok
    for w in ("a", "b"):
        c = json.loads((path / "segments" / w / "zreplay" / "commit.json").read_text())
        assert c["format"] == FORMAT_VERSION and c["contents"]
        seg = zarr.open_group(path / "segments" / w, mode="r")  # what plain zarr shows
        assert seg["data/actions"].shape[0] == c["n_rows"]
        assert seg.attrs["live_rows"] == [c["low_row"], c["n_rows"]]
        assert c["inserted"] == (c["n_rows"] if version < 4 else c["inserted"])

    assert zreplay.upgrade(path) is None  # current: nothing to do
    with zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(path), writer_id="a", sampler=Prioritized()
    ) as a:  # its writer goes on: ids are never reused, priorities were kept
        assert a.add_trajectories([make_traj(20)])[0] == 3
        check_rows(a.sample(32))


def test_a_format_4_buffer_keeps_its_nested_shard_files(tmp_path):
    """tests/data/format4-buffer.tar.gz (zreplay at e574596): its data arrays keep their
    c/<shard>/0/... files, which each array's zarr.json names."""
    with tarfile.open(DATA / "format4-buffer.tar.gz") as t:
        t.extractall(tmp_path, filter="data")
    path = tmp_path / "fmt4"
    refused_on_opening(path)
    nested = sorted(p for p in files_of(path) if "/data/" in p and "/c/" in p)
    assert nested
    assert zreplay.upgrade(path) == 4
    assert sorted(p for p in files_of(path) if "/data/" in p and "/c/" in p) == nested
    view = zreplay.open(path, seed=1)
    assert view.num_trajectories == 7
    assert set(check_rows(view.sample(256)) // 10000) == {3, 4, 5, 6, 7, 100, 101}
    assert zreplay.verify(path).ok


def test_a_root_an_older_writer_upgraded_keeps_no_older_segment(tmp_path):
    """Writers of earlier versions set the root to format 5 and moved only their own
    segment: a segment still of format 2 (or with format-3 commits) is refused on
    opening, by a reader and by its own writer, and upgraded with the rest."""
    path = tmp_path / "b"
    make_buffer(path)
    before = observe(path)
    as_format_2(path, segments=("b",), root_too=False)
    as_format_3(path, segments=("a",), root_too=False)
    with pytest.raises(FormatError, match=UPGRADE):
        zreplay.open(path)
    for w in ("a", "b"):
        with pytest.raises(FormatError, match=UPGRADE):
            zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path), writer_id=w)
    assert zreplay.upgrade(path) == 2
    assert observe(path) == before and zreplay.verify(path).ok


def test_a_live_writer_is_refused_and_nothing_changes(tmp_path):
    path = tmp_path / "b"
    make_buffer(path)
    as_format_3(path, segments=("b",), root_too=False)
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path), writer_id="a"):
        files = files_of(path)
        with pytest.raises(WriterLockedError, match="segment 'a'"):
            zreplay.upgrade(path)
        assert files_of(path) == files
    assert zreplay.upgrade(path) == 3


def test_a_live_writer_of_format_2_is_refused(tmp_path):
    """An older zreplay writing a format-2 buffer holds its lock beside the arrays."""
    path = tmp_path / "b"
    make_buffer(path)
    as_format_2(path)
    lock = path / "segments" / "b" / "writer.lock"
    info = {"host": socket.gethostname(), "pid": os.getpid(), "token": "t", "time": time.time()}
    lock.write_text(json.dumps({**info, "boot": BOOT_ID, "pidns": PID_NS, "lease_s": 30.0}))
    files = files_of(path)
    held = locate(lock).backend.hold(locate(lock))  # its writer's flock: alive
    try:
        with pytest.raises(WriterLockedError, match="segment 'b'"):
            zreplay.upgrade(path)
    finally:
        if held is not None:
            held.release()
    assert files_of(path) == files
    assert zreplay.upgrade(path) == 2  # its writer gone: the lock is stale
    assert not lock.exists()


def test_what_cannot_be_upgraded_is_refused(tmp_path):
    with pytest.raises(FormatError, match="not a zreplay buffer"):
        zreplay.upgrade(tmp_path)
    path = tmp_path / "b"
    make_buffer(path)
    _set_root_format(path, 1)
    with pytest.raises(FormatError, match="format 1 is not supported"):
        zreplay.upgrade(path)
    with pytest.raises(FormatError, match="format 1 is not supported"):
        zreplay.open(path)


def test_a_link_inside_the_buffer_is_refused_before_anything_is_copied(tmp_path):
    """A buffer is untrusted data: a link in it would bring a file from outside into the
    upgraded buffer."""
    path = tmp_path / "b"
    make_buffer(path)
    as_format_3(path)
    secret = tmp_path / "secret"
    secret.write_text("not the buffer's")
    os.symlink(secret, path / "segments" / "a" / "data" / "actions" / "c.9.0")
    files = files_of(path)
    with pytest.raises(CorruptBufferError, match="symbolic link"):
        zreplay.upgrade(path)
    assert files_of(path) == files
    assert zarr.open_group(path, mode="r").attrs["zreplay"]["format"] == 3


def test_the_command_line_upgrades_and_says_when_there_is_nothing_to_do(tmp_path, capsys):
    path = tmp_path / "b"
    make_buffer(path)
    as_format_3(path)
    assert cli(["info", str(path)]) == 1
    assert UPGRADE in capsys.readouterr().err
    assert cli(["upgrade", str(path)]) == 0
    assert f"from zreplay format 3 to {FORMAT_VERSION}" in capsys.readouterr().out
    assert cli(["upgrade", "--json", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"ok": True, "path": str(path), "from_format": None, "format": FORMAT_VERSION}
    assert cli(["upgrade", str(tmp_path / "none")]) == 1
    assert "no such file" in capsys.readouterr().err


def test_an_object_store_buffer_upgrades(s3):
    url = f"s3://{S3_BUCKET}/upgrade/{os.urandom(4).hex()}/buf"
    make_buffer(url, s3)
    before = observe(url, s3)
    as_format_3(url, s3)
    refused_on_opening(url, s3)
    assert zreplay.upgrade(url, storage_options=s3) == 3
    assert observe(url, s3) == before
    assert zreplay.verify(url, storage_options=s3).ok


# -- all or nothing ---------------------------------------------------------------------


def _upgrade_in_child(path: str, at: int) -> None:
    with Faults(at, "crash").installed():
        zreplay.upgrade(path)


@pytest.fixture(scope="module")
def old_buffer(tmp_path_factory):
    """A format-2 buffer (the upgrade that moves the most) and what it holds."""
    path = tmp_path_factory.mktemp("upgrade") / "template"
    make_buffer(path)
    want = observe(path)
    as_format_2(path)
    counter = Faults()
    work = path.with_name("count")
    shutil.copytree(path, work)
    with counter.installed():
        assert zreplay.upgrade(work) == 2
    assert observe(work) == want
    return path, want, files_of(path), counter.calls


def _outcome(path, want, old_files) -> str:
    """``"old"`` (the old buffer, every file as it was, and still upgradable) or
    ``"new"`` (the upgraded buffer); anything else fails."""
    try:
        got = observe(path)
    except FormatError as e:
        assert UPGRADE in str(e)
        assert files_of(path) == old_files
        assert zreplay.upgrade(path) == 2
        assert observe(path) == want
        return "old"
    assert got == want and zreplay.verify(path).ok
    assert zreplay.upgrade(path) is None
    return "new"


@pytest.mark.parametrize("mode", ["error", "interrupt"])
def test_an_upgrade_is_all_or_nothing_under_errors_and_ctrl_c(old_buffer, tmp_path, mode):
    template, want, old_files, calls = old_buffer
    # A few points in the quick suite (the kill -9 sweep below takes 24, ZREPLAY_FAULT_POINTS
    # sets both; =all is every call).
    points = injection_points(calls, budget(8), seed=zlib.crc32(mode.encode()))
    seen = {"old": 0, "new": 0}
    sweep_faults(
        template,
        tmp_path,
        points,
        lambda at: (Faults if mode == "error" else Interrupts)(at, "error"),
        zreplay.upgrade,
        lambda path: _outcome(path, want, old_files),
        seen,
    )
    print(f"\nupgrade [{mode}]: {calls} store calls, {len(points)} points, {seen}")
    assert seen["old"] > 0, seen


@pytest.mark.slow
def test_an_object_store_upgrade_is_all_or_nothing_under_errors(s3):
    """The same sweep on S3 (moto's server), fewer points: the upgrade is built in the
    buffer's meta node and rolled forward (store/objectswap.py)."""
    base = f"s3://{S3_BUCKET}/upgrade-faults/{os.urandom(4).hex()}"
    template = locate(f"{base}/template", s3)
    make_buffer(str(template), s3)
    want = observe(str(template), s3)
    as_format_3(str(template), s3)
    old_files = files_of(str(template), s3)

    def copy(name: str) -> str:
        dst = template.with_name(name)
        for rel, loc in template.backend.walk_files(template):
            template.backend.copy(loc.key, (dst / rel).key)
        return str(dst)

    counter = Faults()
    with counter.installed():
        assert zreplay.upgrade(copy("count"), storage_options=s3) == 3
    seen = {"old": 0, "new": 0}
    points = injection_points(counter.calls, budget(4), seed=zlib.crc32(b"s3"))
    for at in points:
        path = copy(f"at{at}")
        faults = Faults(at, "error")
        try:
            with faults.installed():
                zreplay.upgrade(path, storage_options=s3)
        except (OSError, ZReplayError) as e:
            assert str(e), "an error without a message"
        try:
            got = observe(path, s3)
        except FormatError:
            assert files_of(path, s3) == old_files
            assert zreplay.upgrade(path, storage_options=s3) == 3
            got = observe(path, s3)
            seen["old"] += 1
        else:
            seen["new"] += 1
        assert got == want, f"at store call {at} of {counter.calls}: {faults.fired}"
    print(f"\nupgrade [error] s3: {counter.calls} store calls, {len(points)} points, {seen}")
    assert seen["old"] > 0, seen


@pytest.mark.slow
def test_an_upgrade_killed_at_any_store_call_leaves_old_or_new(old_buffer, tmp_path):
    template, want, old_files, calls = old_buffer
    seen = {"old": 0, "new": 0}
    points = injection_points(calls, budget(24), seed=zlib.crc32(b"crash"))
    outcome = lambda path: _outcome(path, want, old_files)  # noqa: E731
    sweep_kills(template, tmp_path, points, processes(), _upgrade_in_child, outcome, seen)
    print(f"\nupgrade [crash]: {calls} store calls, {len(points)} points, {seen}")
    assert seen["old"] > 0, seen  # (the swap is the last call: a kill there is before it)


def test_an_upgrade_that_another_one_overtook_rewrites_nothing(tmp_path, monkeypatch):
    """Between an upgrade's checks and the writer locks it then takes, another upgrade
    ran and a new run made the buffer anew (overwrite=True): the late upgrade reads the
    buffer again under its locks, finds it current and touches nothing (it used to write
    the old root's schema over the new buffer, which then no longer opened)."""
    import zreplay.store.upgrade as upgrade_module

    with tarfile.open(DATA / "format4-buffer.tar.gz") as t:
        t.extractall(tmp_path, filter="data")
    path = tmp_path / "fmt4"
    real = upgrade_module.new_tree
    overtaken = []

    def meanwhile(*args, **kw):
        monkeypatch.setattr(upgrade_module, "new_tree", real)
        overtaken.append(zreplay.upgrade(path))  # another process's upgrade
        with zreplay.TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=str(path), overwrite=True
        ) as w:
            w.add_trajectories([{"rewards": np.arange(20, dtype=np.float32).reshape(10, 2)}])
        return real(*args, **kw)

    monkeypatch.setattr(upgrade_module, "new_tree", meanwhile)
    assert zreplay.upgrade(path) is None
    assert overtaken == [4]
    view = zreplay.open(path)
    assert view.keys() == ["rewards"] and view.num_rows == 20
    assert set(view.sample(64)["rewards"].tolist()) <= set(range(20))
    assert zreplay.verify(path).ok
