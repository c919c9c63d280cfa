"""Buffers crafted by a stranger: links out of the buffer, unsafe names, wild numbers,
FIFOs where files belong, inconsistent HDF5 episode indexes.

Each crafted buffer is opened the ways a user would (a resuming writer, a reader, verify,
``zreplay info``) and must give a clear error (type and message), change nothing outside
the buffer, block on nothing and allocate no more than its files can justify.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from contextlib import closing
from pathlib import Path

import builders
import numpy as np
import pytest
from conftest import tree_state, zreplay_cli

import zreplay
from zreplay import CorruptBufferError
from zreplay.samplers import Prioritized

SRC = str(Path(zreplay.__file__).resolve().parents[1])


def _buffer(root: Path, **kw) -> Path:
    with closing(builders.writer(root, **kw)) as buf:
        buf.add([builders.full(i, T=2, B=2) for i in range(4)])
        if "sampler" in kw:
            buf.sample(4)
    return root


@pytest.fixture
def outer(tmp_path) -> Path:
    """A directory holding a buffer (``buf.zarr``) and a stranger's files beside it that
    zreplay must never touch: temp-looking files and a ``data/`` tree."""
    (tmp_path / "data" / "deep").mkdir(parents=True)
    (tmp_path / "data" / "deep" / "precious.bin").write_bytes(b"keep me")
    (tmp_path / "notes.tmp").write_text("keep me too")
    (tmp_path / "x.partial").write_text("and me")
    _buffer(tmp_path / "buf.zarr")
    return tmp_path


def _commit_path(buf: Path, wid: str = "default") -> Path:
    return buf / "segments" / wid / "zreplay" / "commit.json"


def _edit_commit(buf: Path, edit) -> None:
    p = _commit_path(buf)
    doc = json.loads(p.read_text())
    edit(doc)
    p.write_text(json.dumps(doc))


def _resume_and_clear(buf: Path) -> None:
    with closing(builders.writer(buf)) as b:
        b.add([builders.full(9, T=2, B=2)])
        b.clear()


def _resume_torchrl(buf: Path) -> None:
    from zreplay.torchrl import ZarrStorage

    storage = ZarrStorage(8, path=str(buf))
    try:
        storage.get(0)
    finally:
        storage.close()


def _read(buf: Path) -> None:
    zreplay.open(buf).sample(2)


OPENERS = {"writer": _resume_and_clear, "torchrl": _resume_torchrl, "reader": _read}


# -- item 2: links out of (or inside) the buffer ---------------------------------------


@pytest.mark.parametrize("how", OPENERS)
def test_segment_linked_out_of_the_buffer_is_refused_and_nothing_outside_changes(outer, how):
    buf = outer / "buf.zarr"
    seg = buf / "segments" / "default"
    os.rename(seg, outer / "moved-segment")  # the link's target keeps a real segment
    os.symlink("../..", seg)  # segments/default -> the directory holding the buffer
    before = tree_state(outer, skip=buf)
    with pytest.raises(CorruptBufferError, match="symbolic link") as e:
        OPENERS[how](buf)
    assert "segments/default" in str(e.value)
    assert tree_state(outer, skip=buf) == before
    assert (outer / "data" / "deep" / "precious.bin").read_bytes() == b"keep me"
    assert (outer / "notes.tmp").exists() and (outer / "x.partial").exists()
    report = zreplay.verify(buf)
    assert not report.ok and "symbolic link" in report.problems[0]
    assert tree_state(outer, skip=buf) == before


@pytest.mark.parametrize(
    "rel",
    [
        "segments/default/data",
        "segments/default/data/rewards",
        "segments/default/offsets",
        "segments/default/zreplay",  # commit record, lock, staging
        "zreplay",  # writer claims, schema marker
    ],
)
def test_links_below_the_segment_are_refused_before_anything_is_written(outer, rel):
    buf = outer / "buf.zarr"
    p = buf / rel
    moved = outer / "moved"  # outside the buffer, holding what was there
    os.rename(p, moved)
    os.symlink(os.path.relpath(moved, p.parent), p)
    before = tree_state(outer, skip=buf)
    with pytest.raises(CorruptBufferError, match="symbolic link"):
        _resume_and_clear(buf)
    assert tree_state(outer, skip=buf) == before


def test_a_link_that_stays_inside_the_buffer_is_refused_too(outer):
    buf = outer / "buf.zarr"
    seg = buf / "segments" / "default"
    os.rename(seg, buf / "segments" / "real")
    os.symlink("real", seg)
    with pytest.raises(CorruptBufferError, match="symbolic link"):
        _read(buf)


def test_the_buffer_path_itself_may_be_a_link(outer):
    os.symlink(outer / "buf.zarr", outer / "alias.zarr")
    assert zreplay.open(outer / "alias.zarr").num_rows == 16
    with closing(builders.writer(outer / "alias.zarr")) as b:
        b.add([builders.full(9, T=2, B=2)])
    assert zreplay.verify(outer / "alias.zarr").ok


# -- item 3: names read from disk ------------------------------------------------------


def test_schema_key_leading_out_of_the_buffer_is_refused(outer):
    buf = outer / "buf.zarr"
    meta = buf / "zarr.json"
    doc = json.loads(meta.read_text())
    info = doc["attributes"]["zreplay"]
    # data/<key> of segment "default" is the real rewards array, moved out of the buffer
    os.rename(buf / "segments" / "default" / "data" / "rewards", outer / "moved")
    bad = "../../../../moved"
    info["schema"][bad] = info["schema"].pop("rewards")
    info["layout"][bad] = info["layout"].pop("rewards")
    meta.write_text(json.dumps(doc))
    before = tree_state(outer, skip=buf)
    for opener in (_read, _resume_and_clear):
        with pytest.raises(CorruptBufferError) as e:
            opener(buf)
        assert bad in str(e.value) and "zarr.json" in str(e.value)
    report = zreplay.verify(buf)
    assert not report.ok and bad in report.problems[0]
    done = zreplay_cli("info", str(buf))
    assert done.returncode != 0
    assert bad in done.stderr and "kvstore" not in done.stderr + done.stdout  # no raw spec
    assert tree_state(outer, skip=buf) == before


def test_segment_directory_named_unlike_any_writer_id_is_refused(outer):
    buf = outer / "buf.zarr"
    odd = buf / "segments" / "a b"
    odd.mkdir()
    (odd / "zarr.json").write_text("{}")
    with pytest.raises(CorruptBufferError, match="'a b'"):
        _read(buf)
    assert not zreplay.verify(buf).ok


# -- item 4: numbers and file kinds read from disk ---------------------------------------


_PY_OPEN = "import sys, zreplay\ntry:\n    {call}\nexcept Exception as e:\n    print(type(e).__name__, e)\n"


@pytest.mark.parametrize("rel", ["zreplay/commit.json", "offsets/c/0", "data/actions/c.0.0"])
@pytest.mark.parametrize(
    "call",
    ["zreplay.open(sys.argv[1])", "print(zreplay.verify(sys.argv[1]))", "cli"],
)
def test_fifo_in_place_of_a_file_never_blocks(outer, call, rel):
    buf = outer / "buf.zarr"
    p = buf / "segments" / "default" / rel  # the commit record; an index chunk
    p.unlink()
    os.mkfifo(p)
    if call == "cli":
        cmd = [sys.executable, "-m", "zreplay.cli", "info", str(buf)]
    else:
        cmd = [sys.executable, "-c", _PY_OPEN.format(call=call), str(buf)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    try:  # a reader blocked on the FIFO would wait forever: the timeout is the failure
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{call} blocked on a FIFO in place of {rel}")
    out = done.stdout + done.stderr
    assert "not a regular file" in out and str(p) in out, out


def test_crafted_priority_capacity_is_refused_without_allocating_it(tmp_path):
    buf = _buffer(tmp_path / "buf.zarr", sampler=Prioritized())
    _edit_commit(buf, lambda d: d["sampler"]["priority"].update(capacity=1 << 26))
    tracemalloc.start()
    try:
        with pytest.raises(CorruptBufferError, match="capacity=67108864"):
            zreplay.open(buf, sampler=Prioritized()).sample(4)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"{peak >> 20} MiB allocated for a 16-row buffer"
    report = zreplay.verify(buf)
    assert not report.ok and "capacity=67108864" in report.problems[0]


@pytest.mark.parametrize(
    "field, value",
    [
        ("next_episode", 2**70),
        ("writer_number", 2**40),
        ("inserted", 2**64),
        ("gen", -1),
    ],
)
def test_commit_numbers_beyond_int64_are_damage_named_by_field(tmp_path, field, value):
    buf = _buffer(tmp_path / "buf.zarr")
    _edit_commit(buf, lambda d: d.update({field: value}))
    for opener in (_read, _resume_and_clear):
        with pytest.raises(CorruptBufferError, match=f"{field}={value}"):
            opener(buf)
    report = zreplay.verify(buf)
    assert not report.ok and f"{field}={value}" in report.problems[0]


def test_used_up_trajectory_ids_fail_the_add_clearly_and_add_nothing(tmp_path):
    buf = _buffer(tmp_path / "buf.zarr")
    _edit_commit(buf, lambda d: d.update(next_trajectory_id=2**63 - 1))
    with closing(builders.writer(buf)) as b:
        b.add([builders.full(9, T=2, B=2)])  # takes the last id, 2**63 - 1
        with pytest.raises(zreplay.CapacityError, match="trajectory ids"):
            b.add([builders.full(10, T=2, B=2)])
        assert b.num_trajectories == 5
    assert zreplay.verify(buf).ok
    view = zreplay.open(buf)
    assert view.num_trajectories == 5 and view.next_trajectory_id == 2**63


# -- item 5: HDF5 episode files with an inconsistent episode index -----------------------


def _h5(path: Path, lens, offs, steps: int = 6) -> Path:
    import h5py

    with h5py.File(path, "w") as f:  # stable-worldmodel's layout: no zreplay attribute
        f["action"] = np.arange(steps * 2, dtype=np.float32).reshape(steps, 2)
        f["reward"] = np.arange(steps, dtype=np.float32)
        f["ep_len"] = np.asarray(lens, np.int32)
        f["ep_offset"] = np.asarray(offs, np.int64)
    return path


def test_a_consistent_hdf5_file_loads_every_step(tmp_path):
    rb = zreplay.load_hdf5(_h5(tmp_path / "ok.h5", [2, 4], [0, 2]))
    try:
        assert len(rb) == 6
    finally:
        rb.close()
    got = [e["reward"].tolist() for e in zreplay.iter_hdf5(tmp_path / "ok.h5")]
    assert got == [[0, 1], [2, 3, 4, 5]]


@pytest.mark.parametrize(
    "lens, offs, why",
    [
        ([3, 3], [0, 0], "share step 0"),  # the first episode twice, steps 3..5 never
        ([2, 2], [0, 4], "cover 4 of the 6"),  # steps 2, 3 dropped
        ([3, 5], [0, 3], r"episode 1 is steps \[3, 8\) of 6"),  # cut short by slicing
        ([3, 3], [0], "2 ep_len entries but 1 ep_offset"),
        ([6, 0], [0, 6], "episode 1 has 0 steps"),
        ([3, 3], [0, -3], r"episode 1 is steps \[-3, 0\)"),
    ],
)
def test_inconsistent_hdf5_episode_index_is_refused_before_anything_is_written(
    tmp_path, lens, offs, why
):
    src = _h5(tmp_path / "bad.h5", lens, offs)
    dest = tmp_path / "imported.zarr"
    with pytest.raises(zreplay.FormatError, match=why) as e:
        zreplay.load_hdf5(src, path=str(dest))
    assert "bad.h5" in str(e.value) and "episode index" in str(e.value)
    assert not dest.exists()
    with pytest.raises(zreplay.FormatError, match=why):
        list(zreplay.iter_hdf5(src))
    done = zreplay_cli("import", str(src), str(dest))
    assert done.returncode != 0 and "episode index" in done.stderr
    assert not dest.exists()


# -- item 2, second attack: links at the root's own files and directories --------------


@pytest.mark.parametrize(
    "rel", ["zreplay/schema.json.guard", "segments/default/zreplay/writer.lock.guard"]
)
def test_a_lock_file_linked_out_of_the_buffer_creates_nothing_there(outer, rel):
    buf = outer / "buf.zarr"
    target = outer / "created-by-a-link"
    p = buf / rel
    p.unlink(missing_ok=True)
    os.symlink(target, p)
    with pytest.raises(CorruptBufferError, match="symbolic link"):
        _resume_and_clear(buf)
    assert not target.exists()


@pytest.mark.parametrize("rel", ["zreplay/writers", "zreplay/learners", "segments"])
def test_the_roots_directories_linked_out_are_refused_and_nothing_outside_changes(outer, rel):
    from zreplay.store.liveness import process_tag

    buf = outer / "buf.zarr"
    p = buf / rel
    moved = outer / "moved"
    if p.exists():
        os.rename(p, moved)
    else:
        moved.mkdir()
    os.symlink(os.path.relpath(moved, p.parent), p)
    # A temp file named as a dead process's would be removed by an opening writer.
    dead = process_tag().replace(".", "_").rsplit("-", 1)[0] + "-999999999"
    (moved / f"precious.{dead}.abcdef.tmp").write_text("keep me")
    before = tree_state(outer, skip=buf)
    with pytest.raises(CorruptBufferError, match="symbolic link"):
        with closing(builders.writer(buf, writer_id="w2")) as b:
            b.add([builders.full(9, T=2, B=2)])
    with pytest.raises(CorruptBufferError, match="symbolic link"):
        zreplay.open(buf, rate_limiter=zreplay.MinSize(1), learner_id="evil_target_name")
    assert tree_state(outer, skip=buf) == before
    assert not zreplay.verify(buf).ok


# -- item 4, second attack: records a writer reads on opening ------------------------------


def _crafted_lock(buf: Path, field: str) -> None:
    """A writer's lock files as another machine's writer left them, with JSON Infinity
    where an integer goes."""
    ref = buf.parent / "ref.zarr"
    with closing(builders.writer(ref)):
        z = ref / "segments" / "default" / "zreplay"
        lock = json.loads((z / "writer.lock").read_text())
        beat_path = z / "writer.lock.beat"
        beat = json.loads(beat_path.read_text()) if beat_path.exists() else {}
    lock.update(boot="another-machine", host="otherhost", lease_s=0)  # the shortest lease
    beat.setdefault("token", lock.get("token"))
    beat.setdefault("seq", 0)
    (lock if field == "pid" else beat)[field] = float("inf")
    z = buf / "segments" / "default" / "zreplay"
    (z / "writer.lock").write_text(json.dumps(lock))
    (z / "writer.lock.beat").write_text(json.dumps(beat))


@pytest.mark.parametrize("field", ["pid", "seq"])
def test_a_lock_holding_infinity_is_judged_not_crashed_on(outer, field):
    buf = outer / "buf.zarr"
    _crafted_lock(buf, field)
    try:  # another machine's lock: taken over once its lease runs out, or refused
        with closing(builders.writer(buf)) as b:
            b.add([builders.full(9, T=2, B=2)])
    except zreplay.WriterLockedError:
        pass
    assert zreplay.open(buf).num_trajectories >= 4


@pytest.mark.parametrize("how", ["unknown field", "not json", "a string count"])
def test_a_crafted_load_record_is_refused_and_the_commit_kept(outer, how):
    buf = outer / "buf.zarr"
    z = buf / "segments" / "default" / "zreplay"
    commit = json.loads((z / "commit.json").read_text())
    before = (z / "commit.json").read_bytes()
    crafted = dict(commit)
    if how == "unknown field":
        crafted["evil"] = 1
    elif how == "a string count":
        crafted["n_rows"] = str(crafted["n_rows"])
    intent = {"writer_id": "default", "commit": crafted, "schema": None, "layout": None}
    text = "{{{" if how == "not json" else json.dumps(dict(intent, children=[]))
    (z / "replace.json").write_text(text)
    with pytest.raises(CorruptBufferError, match="replace.json"):
        builders.writer(buf)
    assert (z / "commit.json").read_bytes() == before


@pytest.mark.parametrize("how", ["rng state", "rng kind", "infinite count"])
def test_a_crafted_random_stream_is_damage_named(outer, how):
    buf = outer / "buf.zarr"

    def craft(c):
        s = c["sampler"]
        if how == "rng state":
            s["rng"] = {"bit_generator": "PCG64", "state": {"state": "x", "inc": 1}}
        elif how == "rng kind":
            s["rng"] = {"bit_generator": "MT19937", "state": {}}
        else:
            s["num_sampled"] = float("inf")

    _edit_commit(buf, craft)
    with pytest.raises(CorruptBufferError, match="random stream"):
        builders.writer(buf)


@pytest.mark.parametrize("rel", ["segments/default/zreplay/commit.json", "zarr.json"])
def test_a_sparse_giant_record_is_refused_without_reading_it(outer, rel):
    """A few KB on disk, 3 GB long: a reader must not read it whole."""
    buf = outer / "buf.zarr"
    with open(buf / rel, "r+b") as f:
        f.truncate(3 << 30)
    tracemalloc.start()
    try:
        for open_it in (
            lambda: zreplay.open(buf),
            lambda: builders.writer(buf),
        ):
            with pytest.raises(CorruptBufferError, match="more than any file zreplay reads"):
                open_it()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20
    assert not zreplay.verify(buf).ok


_GIANT_RECORD_CHILD = """
import sys
if sys.argv[3] == "s3fs":
    sys.modules["obstore"] = None  # as where obstore is not installed: the s3fs client
import json
import zreplay
from zreplay.store import backend_s3
backend_s3.MAX_READ_BYTES = 1 << 20
try:
    zreplay.open(sys.argv[1], storage_options=json.loads(sys.argv[2]))
except zreplay.CorruptBufferError as e:
    print("REFUSED", e)
"""


@pytest.mark.parametrize("client", ["obstore", "s3fs"])
@pytest.mark.parametrize(
    "rel",
    ["segments/default/zreplay/commit.json", "zarr.json", "segments/default/data/obs/zarr.json"],
)
def test_a_giant_record_in_an_object_store_is_refused_from_its_size(url, s3, client, rel):
    """On S3 as on a disk, a record longer than any zreplay reads whole is refused, from
    the size the GET's response declares (obstore) or a HEAD (s3fs), not by reading it:
    a bucket may come from a stranger.  (The bound is lowered to 1 MiB in the child: a
    record of 256 MiB would cost the test as much.)"""
    from zreplay.store.location import locate

    with closing(builders.writer(url, storage_options=s3)) as core:
        builders.add(core, 0)
    obj = locate(url, s3) / rel
    obj.write_bytes(b"{" + b" " * (2 << 20) + b"}")
    out = subprocess.run(
        [sys.executable, "-c", _GIANT_RECORD_CHILD, url, json.dumps(s3), client],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "REFUSED" in out.stdout, out.stdout + out.stderr
    assert f"{obj} is 2,097,154 bytes or more" in out.stdout
    assert "more than any file zreplay reads whole" in out.stdout


@pytest.mark.parametrize("how", ["save_checkpoint", "load_checkpoint"])
def test_a_checkpoint_never_takes_in_what_a_planted_link_names(tmp_path, how):
    """A link planted among a buffer's files (not an array's: those are checked at open)
    is neither hard-linked nor copied into a checkpoint: either would take in the file
    outside it names."""
    buf = tmp_path / "buf"
    with closing(builders.writer(buf)) as core:
        builders.add(core, 0)
    secret = tmp_path / "secret"
    secret.write_text("credentials")
    (buf / "segments" / "default" / "zreplay" / "notes").symlink_to(secret)
    if how == "save_checkpoint":
        dest = tmp_path / "ckpt"
        with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(buf)) as b:
            with pytest.raises(CorruptBufferError, match="is a symbolic link"):
                b.save_checkpoint(str(dest))
    else:
        dest = tmp_path / "other"
        with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(dest)) as b:
            with pytest.raises(CorruptBufferError, match="is a symbolic link"):
                b.load_checkpoint(str(buf))
    found = [p for p in tmp_path.rglob("*") if p.is_file() and p != secret]
    assert not any(p.read_bytes() == b"credentials" for p in found if not p.is_symlink())
    assert secret.stat().st_nlink == 1  # no hard link to it anywhere


def test_a_giant_record_through_fsspec_is_refused_from_its_size(monkeypatch):
    """The fsspec backends (``memory://``, GCS, Azure, ...) bound a whole read alike."""
    import uuid

    from zreplay.store import backend_fsspec
    from zreplay.store.location import locate

    monkeypatch.setattr(backend_fsspec, "MAX_READ_BYTES", 1 << 20)
    top = locate(f"memory://untrusted-{uuid.uuid4().hex[:8]}")
    big, small, empty = top / "big", top / "small", top / "empty"
    big.write_bytes(b" " * ((1 << 20) + 1))
    small.write_bytes(b"x" * (1 << 20))
    empty.write_bytes(b"")
    with pytest.raises(CorruptBufferError, match="1,048,577 bytes or more, more than any"):
        big.read_bytes()
    assert small.read_bytes() == b"x" * (1 << 20)
    assert empty.read_bytes() == b""


def test_an_empty_object_reads_as_empty(url, s3):
    """A whole-object read of an empty object (a lock file an older zreplay left empty)
    is empty bytes, as ``Path.read_bytes`` of an empty file is."""
    from zreplay.store.location import locate

    obj = locate(url, s3) / "empty"
    obj.write_bytes(b"")
    assert obj.read_bytes() == b""


def test_the_memory_bound_is_the_containers(tmp_path, monkeypatch):
    """Crafted counts are refused when their index would not fit in the memory this
    process may have: a container's cgroup limit, not the host's RAM."""
    from zreplay.store import memory

    ram = memory.physical_memory()
    limit = tmp_path / "memory.max"
    limit.write_text(f"{ram // 4}\n")
    monkeypatch.setattr(memory, "_CGROUP_LIMITS", (str(tmp_path / "none"), str(limit)))
    assert memory.physical_memory() == ram // 4
    limit.write_text("max\n")
    assert memory.physical_memory() == ram


@pytest.mark.parametrize("columns", [5, [{"a": 1}], "pixels"])
def test_a_crafted_column_order_is_damage_named(tmp_path, columns):
    path = tmp_path / "rb"
    rb = zreplay.ReplayBuffer(100, path=path)
    rb.write_episode({"pixels": np.zeros((5, 2), np.float32), "action": np.zeros((5, 1))})
    rb.close()

    def craft(c):
        c["sampler"]["facade"]["columns"] = columns

    _edit_commit(path, craft)
    with pytest.raises(CorruptBufferError, match="column order"):
        zreplay.ReplayBuffer(100, path=path)
    zreplay.ReplayBuffer(100, path=path, overwrite=True).close()  # the refusal held nothing
