"""A writer opening a buffer while an import with ``overwrite=True`` replaces it: the
writer gets ``WriterLockedError`` (the buffer is being replaced; open it again), never
damage or a raw ``FileNotFoundError``, and the replacement stays all or nothing: the
result is exactly the imported data, with no segment of the late writer in it or beside
it.  A replacement killed with ``kill -9`` blocks no later writer.  A writer made with
``overwrite=True`` removes the old buffer: a writer opening it meanwhile is refused too."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import check_rows, make_traj, processes
from test_minari import write_minari

import zreplay
from zreplay.errors import WriterLockedError

REPLACED = "is being replaced .* Open it again once that is done"
LENGTHS = [[4, 3], [5, 2, 3]]


def _import_paused(src: str, dst: str, ready: str, go: str) -> int:
    """``import_minari(src, dst, overwrite=True)`` that stops with every lock held and
    the new tree built, just before it is swapped in, until the file ``go`` exists
    (having made ``ready``); ``go`` never made: it waits a minute."""
    import zreplay.store.localswap as localswap

    real = localswap.swap_in

    def paused(tmp, dest):
        Path(ready).touch()
        deadline = time.monotonic() + 60
        while not Path(go).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return real(tmp, dest)

    localswap.swap_in = paused
    return zreplay.import_minari(src, dst, overwrite=True).episodes


def _wait_for(path: Path, job) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline and not job.ready(), "the import never paused"
        time.sleep(0.01)


def _sources(tmp_path: Path) -> list[Path]:
    out = []
    for i, lengths in enumerate(LENGTHS):
        write_minari(tmp_path / f"src{i}", lengths)
        out.append(tmp_path / f"src{i}")
    return out


def _is_exactly(dst: Path, lengths: list[int]) -> None:
    """``dst`` holds the import of ``lengths`` and nothing else, and nothing lies
    beside it (a replace's staging or old tree)."""
    view = zreplay.open(dst)
    assert view.num_trajectories == len(lengths) and view.num_rows == sum(lengths)
    assert sorted(p.name for p in (dst / "segments").iterdir()) == ["offline", "zarr.json"]
    assert [p.name for p in dst.parent.iterdir() if p.name.startswith(f".{dst.name}.")] == []
    assert not (dst / "zreplay" / "writer.lock").exists()
    assert zreplay.verify(dst).ok


def _open_writer(dst: Path, writer_id: str = "online"):
    return zreplay.ReplayBuffer(100, path=str(dst), writer_id=writer_id)


@pytest.mark.parametrize("writer_id", ["online", "offline"])
def test_a_writer_opening_during_an_import_over_the_buffer_is_told_to_open_again(
    tmp_path, writer_id
):
    """A new segment (the listing of the import missed it) and the segment whose lock
    the import holds: both refused as a replacement, and the import's result is whole."""
    src0, src1 = _sources(tmp_path)
    dst, ready, go = tmp_path / "buf", tmp_path / "ready", tmp_path / "go"
    zreplay.import_minari(src0, dst)
    with processes().Pool(1) as pool:
        job = pool.apply_async(_import_paused, (str(src1), str(dst), str(ready), str(go)))
        _wait_for(ready, job)
        try:
            with pytest.raises(WriterLockedError, match=REPLACED) as e:
                _open_writer(dst, writer_id)
            assert "by pid" in str(e.value)
        finally:
            go.touch()
        assert job.get(timeout=60) == len(LENGTHS[1])
    _is_exactly(dst, LENGTHS[1])
    rb = _open_writer(dst)  # once it is done, a writer opens as ever
    assert rb.num_episodes == len(LENGTHS[1])
    rb.close()


def test_a_writer_whose_segment_was_swapped_out_before_it_checked_is_refused(tmp_path, monkeypatch):
    """The writer made and locked its segment in the old tree, then the import swapped
    the new tree in before the writer looked: its lock went with the old tree, so it
    refuses (nothing read of either tree), and leaves nothing in the new one."""
    import zreplay.engine.writer as writer_module

    src0, src1 = _sources(tmp_path)
    dst, ready, go = tmp_path / "buf", tmp_path / "ready", tmp_path / "go"
    zreplay.import_minari(src0, dst)
    locked, swapped = threading.Event(), threading.Event()

    class SlowWatch(writer_module.TreeWatch):
        def check(self, lock=None, break_lock=False):
            if lock is None and not locked.is_set():
                return  # its first look came before the import began: nothing then
            if lock is not None and not locked.is_set():
                locked.set()
                assert swapped.wait(60)
            return super().check(lock, break_lock)

    monkeypatch.setattr(writer_module, "TreeWatch", SlowWatch)
    errors: list[BaseException] = []

    def open_late():
        try:
            _open_writer(dst).close()
        except BaseException as e:  # noqa: BLE001 - checked below
            errors.append(e)

    with processes().Pool(1) as pool:
        job = pool.apply_async(_import_paused, (str(src1), str(dst), str(ready), str(go)))
        _wait_for(ready, job)
        # The writer's check is held until the swap: it would see the import's mark if
        # it looked before, so it looks only after (the old tree and its lock gone).
        late = threading.Thread(target=open_late)
        late.start()
        try:
            assert locked.wait(60), "the writer never took its lock"
        finally:
            go.touch()
        assert job.get(timeout=60) == len(LENGTHS[1])
        swapped.set()
        late.join(60)
    assert len(errors) == 1 and isinstance(errors[0], WriterLockedError), errors
    assert "just now" in str(errors[0])
    _is_exactly(dst, LENGTHS[1])


def test_a_replacement_killed_mid_way_blocks_no_later_writer(tmp_path):
    """kill -9 of an import holding the buffer's lock and every segment's: its marks die
    with it, so a writer opens the old buffer at once and a new import replaces it."""
    src0, src1 = _sources(tmp_path)
    dst, ready, go = tmp_path / "buf", tmp_path / "ready", tmp_path / "go"
    zreplay.import_minari(src0, dst)
    ctx = processes()
    proc = ctx.Process(target=_import_paused, args=(str(src1), str(dst), str(ready), str(go)))
    proc.start()
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert time.monotonic() < deadline and proc.is_alive(), "the import never paused"
            time.sleep(0.01)
        assert (dst / "zreplay" / "writer.lock").exists()  # the replacement's mark
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.join(30)
    assert proc.exitcode == -signal.SIGKILL
    rb = _open_writer(dst)  # the old buffer, whole
    assert rb.num_episodes == len(LENGTHS[0])
    rb.close()
    assert zreplay.import_minari(src1, dst, overwrite=True).episodes == len(LENGTHS[1])
    _is_exactly(dst, LENGTHS[1])


def _imports_in_a_loop(srcs: list[str], dst: str, seconds: float) -> tuple[int, int]:
    """Replace ``dst`` by imports of ``srcs`` in turn for ``seconds``; returns ``(done,
    refused)``: an import finding a writer's segment locked is refused, as it should."""
    done = refused = 0
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        try:
            zreplay.import_minari(srcs[i % 2], dst, overwrite=True)
            done += 1
            i += 1
        except WriterLockedError:
            refused += 1
    return done, refused


def test_writers_opening_in_a_loop_while_imports_replace_the_buffer(tmp_path):
    """For a few seconds, writers open the buffer again and again (new segments and the
    imported one) while another process replaces it by imports: every open succeeds or
    is refused with WriterLockedError, never another error; the last import's result is
    exactly its data."""
    srcs = _sources(tmp_path)
    dst = tmp_path / "buf"
    zreplay.import_minari(srcs[0], dst)
    rng = random.Random(0)
    outcomes: dict[str, int] = {}
    with processes().Pool(1) as pool:
        job = pool.apply_async(_imports_in_a_loop, ([str(s) for s in srcs], str(dst), 4.0))
        while not job.ready():
            wid = rng.choice(["online", "online", "offline", "late"])
            try:
                rb = _open_writer(dst, wid)
            except WriterLockedError:
                outcomes["refused"] = outcomes.get("refused", 0) + 1
            except zreplay.errors.SealedSegmentError:
                outcomes["sealed"] = outcomes.get("sealed", 0) + 1  # opened between imports
            else:
                # Opened: no import replaces the buffer until it is closed, so what it
                # reads is one tree's and what it writes is committed there.
                try:
                    rb.write_episode(rb.load_episode(0))
                    rb.flush()
                finally:
                    rb.close()
                outcomes["opened"] = outcomes.get("opened", 0) + 1
            time.sleep(rng.uniform(0, 0.2))  # (imports find no writer open, now and then)
        done, _ = job.get(timeout=60)
    assert done >= 1 and outcomes.get("refused", 0) >= 1, (done, outcomes)
    zreplay.import_minari(srcs[1], dst, overwrite=True)
    _is_exactly(dst, LENGTHS[1])


def _overwrite_paused(dst: str, ready: str, go: str) -> None:
    """A writer made with ``overwrite=True`` over the buffer at ``dst`` that stops while
    it holds the buffer's locks, before it removes the old buffer, until ``go`` exists."""
    import zreplay.engine.recovery as recovery

    real = recovery._remove_buffer

    def paused(path):
        Path(ready).touch()
        deadline = time.monotonic() + 60
        while not Path(go).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return real(path)

    recovery._remove_buffer = paused
    with zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=dst, overwrite=True, sample_window_size=0
    ) as buf:
        buf.add_trajectories([make_traj(50)])


def test_a_writer_opening_while_another_starts_the_buffer_afresh_is_told_to_open_again(
    tmp_path,
):
    """``overwrite=True`` removes the whole buffer: a writer of another segment opening
    meanwhile is refused as for an import, and the fresh buffer holds only what the
    overwriting writer added."""
    dst, ready, go = tmp_path / "buf", tmp_path / "ready", tmp_path / "go"
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(dst)) as buf:
        buf.add_trajectories([make_traj(i) for i in range(3)])
    with processes().Pool(1) as pool:
        job = pool.apply_async(_overwrite_paused, (str(dst), str(ready), str(go)))
        _wait_for(ready, job)
        try:
            with pytest.raises(WriterLockedError, match=REPLACED):
                zreplay.TrajectoryReplayBuffer(
                    auto_save=True, auto_save_path=str(dst), writer_id="late"
                )
        finally:
            go.touch()
        job.get(timeout=60)
    assert sorted(p.name for p in (dst / "segments").iterdir()) == ["default", "zarr.json"]
    view = zreplay.open(dst)
    assert view.num_trajectories == 1
    assert set(check_rows(view.sample(64)) // 10000) == {50}
    assert zreplay.verify(dst).ok


def _small_buffer(path: Path) -> None:
    rb = zreplay.ReplayBuffer(100, path=path, writer_id="w0")
    rb.write_episode({"x": np.arange(4, dtype=np.float32)})
    rb.close()


def _segments(path: Path) -> list[str]:
    return sorted(p.name for p in (path / "segments").iterdir() if p.is_dir())


def _wait_for_child(flag: Path, child) -> None:
    """Until the child process (``subprocess.Popen``) made the file ``flag``."""
    deadline = time.monotonic() + 60
    while not flag.exists():
        assert time.monotonic() < deadline and child.poll() is None, "the child never got there"
        time.sleep(0.01)


def _plant_root_lock(path: Path, **holder) -> Path:
    lock = path / "zreplay" / "writer.lock"
    info = {"host": "elsewhere", "pid": 1, "token": "planted", "time": time.time(), **holder}
    lock.write_text(json.dumps(info))
    return lock


def test_a_root_lock_left_on_another_host_is_cleared_by_the_first_writer_that_waits_it_out(
    tmp_path, monkeypatch
):
    # a replacement that died on another machine: only its lease can tell, so the first
    # writer watches it run out; it removes the lock, and later writers do not wait again
    path = tmp_path / "b"
    _small_buffer(path)
    lock = _plant_root_lock(path, boot="another-boot", pidns="x", lease_s=0.5)
    zreplay.ReplayBuffer(100, path=path, writer_id="w1").close()
    assert not lock.exists()
    zreplay.ReplayBuffer(100, path=path, writer_id="w2").close()
    assert _segments(path) == ["w0", "w1", "w2"]


def test_a_root_lock_no_lease_can_judge_names_its_file_and_yields_to_break_lock(tmp_path):
    # no boot id, another host: judged live for good (as a lock of a zreplay before
    # leases), so the way out is said: break_lock=True, or remove the file
    path = tmp_path / "b"
    _small_buffer(path)
    lock = _plant_root_lock(path)
    with pytest.raises(WriterLockedError, match="break_lock=True or remove .*writer.lock"):
        zreplay.ReplayBuffer(100, path=path, writer_id="w1")
    assert _segments(path) == ["w0"]  # nothing made
    src = tmp_path / "src"
    _small_buffer(src)
    with pytest.raises(WriterLockedError, match="If no such process runs, remove .*writer.lock"):
        zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(src)).save_checkpoint(
            str(path)
        )
    rb = zreplay.ReplayBuffer(100, path=path, writer_id="w1", break_lock=True)
    rb.write_episode({"x": np.arange(4, dtype=np.float32)})
    rb.close()
    assert not lock.exists()
    assert zreplay.open(path).num_rows == 8


def test_a_directory_where_the_root_lock_belongs_is_damage_named_for_writers_and_replacements(
    tmp_path,
):
    path = tmp_path / "b"
    _small_buffer(path)
    (path / "zreplay" / "writer.lock").mkdir()
    with pytest.raises(zreplay.CorruptBufferError, match="writer.lock is a directory"):
        zreplay.ReplayBuffer(100, path=path, writer_id="w1")
    src = tmp_path / "src"
    _small_buffer(src)
    with pytest.raises(zreplay.CorruptBufferError, match="writer.lock is a directory"):
        zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(src)).save_checkpoint(
            str(path)
        )


def test_a_writer_refused_by_a_live_replacement_makes_nothing(tmp_path):
    from zreplay.store.location import locate
    from zreplay.store.lock import WriterLock

    path = tmp_path / "b"
    _small_buffer(path)
    root = WriterLock(locate(str(path)))  # as a replacement holds it, in this process
    root.acquire()
    try:
        for make in (
            lambda: zreplay.ReplayBuffer(100, path=path, writer_id="late"),
            lambda: zreplay.TrajectoryReplayBuffer(
                auto_save=True, auto_save_path=str(path), writer_id="late"
            ),
        ):
            with pytest.raises(WriterLockedError, match=REPLACED):
                make()
            assert _segments(path) == ["w0"]
    finally:
        root.release()


def test_break_lock_does_not_break_a_replacement_this_machine_sees_alive(tmp_path):
    # break_lock=True is the writer's word that a lock's holder is gone; a replacement
    # whose flock is held here is not, and breaking its mark would lose this writer's rows
    import subprocess
    import sys

    path = tmp_path / "b"
    _small_buffer(path)
    held = tmp_path / "held"
    code = (
        "import sys, time, pathlib\n"
        "from zreplay.store.location import locate\n"
        "from zreplay.store.lock import WriterLock\n"
        "lock = WriterLock(locate(sys.argv[1])); lock.acquire()\n"
        "pathlib.Path(sys.argv[2]).touch(); time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code, str(path), str(held)])
    try:
        _wait_for_child(held, child)
        with pytest.raises(WriterLockedError, match=REPLACED):
            zreplay.ReplayBuffer(100, path=path, writer_id="late", break_lock=True)
        assert _segments(path) == ["w0"] and (path / "zreplay" / "writer.lock").exists()
    finally:
        child.kill()
        child.wait()
    zreplay.ReplayBuffer(100, path=path, writer_id="late").close()  # its flock died with it


_SLOW_TAKER = """
import pathlib, sys, time
import zreplay.store.liveness as liveness
from zreplay.store.location import locate
from zreplay.store.lock import WriterLock
real = liveness.hold
def slow(loc, *a, **k):  # the lock file made, its flock not yet taken
    pathlib.Path(sys.argv[2]).touch()
    time.sleep(2)
    return real(loc, *a, **k)
liveness.hold = slow
lock = WriterLock(locate(sys.argv[1]))
lock.acquire()
liveness.hold = real
pathlib.Path(sys.argv[3]).touch()
time.sleep(60)
"""


@pytest.mark.parametrize("break_lock", [False, True])
def test_a_writer_looking_while_a_replacement_takes_its_lock_is_refused(tmp_path, break_lock):
    # between making the lock file and taking its flock the file looks stale to a probe;
    # a writer that judged it then removed a live replacement's lock and lost its rows
    import subprocess
    import sys

    path = tmp_path / "b"
    _small_buffer(path)
    made, held = tmp_path / "made", tmp_path / "held"
    child = subprocess.Popen([sys.executable, "-c", _SLOW_TAKER, str(path), str(made), str(held)])
    try:
        _wait_for_child(made, child)
        with pytest.raises(WriterLockedError, match=REPLACED):
            zreplay.ReplayBuffer(100, path=path, writer_id="late", break_lock=break_lock)
        assert held.exists() and (path / "zreplay" / "writer.lock").exists()
        assert _segments(path) == ["w0"]
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("text", ['{"token": [1]}', "[1, 2, 3]", '"hello"', "42", "null", "{}"])
def test_a_root_lock_of_odd_fields_is_judged_as_damaged(tmp_path, text):
    # no holder's flock on it: gone, removed by the first writer (and by a replacement)
    path = tmp_path / "b"
    _small_buffer(path)
    lock = path / "zreplay" / "writer.lock"
    lock.write_text(text)
    zreplay.ReplayBuffer(100, path=path, writer_id="w1").close()
    assert not lock.exists()
    lock.write_text(text)
    src = tmp_path / "src"
    _small_buffer(src)
    zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(src)).save_checkpoint(
        str(path)
    )
    assert not lock.exists()
