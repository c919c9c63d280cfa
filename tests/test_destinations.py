"""Guarded destinations (issue 13, defects 2 and 8): a checkpoint, export, import or dump
target that is the source, lies inside it or holds it, has a live writer, or is a
non-empty directory the operation does not replace is refused before anything is
touched; replacing an older checkpoint is one step, and what killed replaces leave
behind is cleaned up."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest
from conftest import S3_BUCKET, check_rows, make_traj, traj_equal

import zreplay
from zreplay.store import localswap


def persistent(path, **kw):
    kw.setdefault("sample_window_size", 0)
    return zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path), **kw)


def snapshot(path) -> dict:
    """Every file under ``path`` with its bytes (to prove nothing was touched)."""
    out = {}
    for dirpath, _, files in os.walk(path):
        for f in files:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, path)] = fh.read()
    return out


def test_checkpoint_onto_its_own_path_with_a_second_writer_is_refused(tmp_path):
    """Defect 2: this deleted b's segment and a's lock, and let a second writer a in."""
    path = tmp_path / "b"
    a, b = persistent(path, writer_id="a"), persistent(path, writer_id="b")
    a.add_trajectories([make_traj(0)])
    b.add_trajectories([make_traj(1)])
    a.flush()
    b.flush()
    before = snapshot(path)
    with pytest.raises(zreplay.DestinationError, match="is the source buffer itself"):
        a.save_checkpoint(str(path))
    with pytest.raises(zreplay.DestinationError, match="lies inside the source"):
        a.save_checkpoint(str(path / "segments" / "a" / "ckpt"))
    with pytest.raises(zreplay.DestinationError, match="lies inside the target"):
        a.save_checkpoint(str(tmp_path))
    assert snapshot(path) == before
    with pytest.raises(zreplay.WriterLockedError):
        persistent(path, writer_id="a")  # a's lock is still there
    a.add_trajectories([make_traj(2)])
    a.close()
    b.close()
    view = zreplay.open(path)
    assert view.num_trajectories == 3
    check_rows(view.sample(64))
    assert zreplay.verify(path).ok


def test_checkpoint_onto_a_live_buffer_or_a_foreign_directory_is_refused(tmp_path):
    mine, theirs = persistent(tmp_path / "mine"), persistent(tmp_path / "theirs")
    mine.add_trajectories([make_traj(0)])
    theirs.add_trajectories([make_traj(1)])
    theirs.flush()
    before = snapshot(tmp_path / "theirs")
    with pytest.raises(zreplay.WriterLockedError, match="close that writer first"):
        mine.save_checkpoint(str(tmp_path / "theirs"))
    assert snapshot(tmp_path / "theirs") == before
    theirs.add_trajectories([make_traj(2)])  # its writer goes on undisturbed
    theirs.close()
    assert [zreplay.open(tmp_path / "theirs").trajectory(i)["trajectory_id"] for i in (0, 1)] == [
        0,
        1,
    ]
    mine.save_checkpoint(str(tmp_path / "theirs"))  # with no live writer it is replaced
    assert zreplay.open(tmp_path / "theirs").num_trajectories == 1
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("keep me")
    with pytest.raises(zreplay.DestinationError, match="non-empty directory"):
        mine.save_checkpoint(str(tmp_path / "notes"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(zreplay.DestinationError, match="is a file"):
        mine.save_checkpoint(str(tmp_path / "file"))
    assert (tmp_path / "notes" / "a.txt").read_text() == "keep me"
    mine.close()


def test_export_is_guarded_and_replaces_an_earlier_export_whole(tmp_path, monkeypatch):
    buf = persistent(tmp_path / "b")
    buf.add_trajectories([make_traj(t) for t in range(3)])
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "a.txt").write_text("keep me")
    with pytest.raises(zreplay.DestinationError, match="not an RLinf buffer directory"):
        buf.export(str(tmp_path / "mine"))
    with pytest.raises(zreplay.DestinationError, match="lies inside the source"):
        buf.export(str(tmp_path / "b" / "out"))
    assert not (tmp_path / "b" / "out").exists()
    out = tmp_path / "rl"
    assert buf.export(str(out)) == 3
    first = snapshot(out)
    buf.clear()
    buf.add_trajectories([make_traj(7)])
    # A failure half way leaves the earlier export as it was, and nothing beside it.
    import torch

    save, calls = torch.save, []

    def failing(*a, **kw):
        calls.append(1)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", failing)
    with pytest.raises(OSError, match="No space"):
        buf.export(str(out))
    monkeypatch.setattr(torch, "save", save)
    assert calls and snapshot(out) == first
    assert sorted(os.listdir(tmp_path)) == ["b", "mine", "rl"]
    assert buf.export(str(out)) == 1  # replaced whole: the old trajectories' files are gone
    new = buf.trajectory(0)
    want = f"trajectory_{new['trajectory_id']}_{new['model_weights_id']}.pt"
    assert new["trajectory_id"] == 3  # clear() never reuses ids
    assert sorted(f for f in os.listdir(out) if f.endswith(".pt")) == [want]
    buf.close()
    with pytest.raises(ValueError, match="trajectory_format must be 'pt' or 'pkl'"):
        zreplay.TrajectoryReplayBuffer(trajectory_format="npz")


def test_import_rlinf_is_all_or_nothing_and_guarded(tmp_path):
    buf = persistent(tmp_path / "b")
    buf.add_trajectories([make_traj(t) for t in range(3)])
    buf.export(str(tmp_path / "rl"))
    buf.close()
    with pytest.raises(zreplay.DestinationError, match="pass overwrite=True"):
        zreplay.import_rlinf(str(tmp_path / "rl"), str(tmp_path / "b"))
    live = persistent(tmp_path / "b")
    with pytest.raises(zreplay.WriterLockedError):
        zreplay.import_rlinf(str(tmp_path / "rl"), str(tmp_path / "b"), overwrite=True)
    live.close()
    with pytest.raises(zreplay.DestinationError, match="lies inside"):
        zreplay.import_rlinf(str(tmp_path / "rl"), str(tmp_path / "rl" / "x"))
    # A damaged file found half way: nothing at a new path, the old buffer kept.
    files = sorted((tmp_path / "rl").glob("trajectory_*.pt"))
    files[-1].write_bytes(files[-1].read_bytes()[:100])
    for dst, overwrite in ((tmp_path / "new", False), (tmp_path / "b", True)):
        before = snapshot(dst) if dst.exists() else None
        with pytest.raises(Exception) as info:
            zreplay.import_rlinf(str(tmp_path / "rl"), str(dst), overwrite=overwrite)
        assert not isinstance(info.value, zreplay.DestinationError)
        assert (snapshot(dst) if dst.exists() else None) == before
    assert sorted(os.listdir(tmp_path)) == ["b", "rl"]


def test_load_and_dump_refuse_overlapping_paths(tmp_path):
    buf = persistent(tmp_path / "b")
    buf.add_trajectories([make_traj(0)])
    buf.save_checkpoint(str(tmp_path / "ckpt"))
    with pytest.raises(zreplay.DestinationError, match="load_checkpoint: the target"):
        buf.load_checkpoint(str(tmp_path))  # a directory holding the buffer itself
    with pytest.raises(zreplay.DestinationError):
        zreplay.dump(buf, tmp_path / "b" / "ep.h5")
    with pytest.raises(zreplay.DestinationError, match="is the source buffer itself"):
        zreplay.dump(buf, tmp_path / "b", format="zarr")
    other = persistent(tmp_path / "live")
    with pytest.raises(zreplay.WriterLockedError):
        zreplay.dump(buf, tmp_path / "live", format="zarr")
    other.close()
    buf.close()
    assert zreplay.verify(tmp_path / "b").ok


# -- replacing a checkpoint: one step, leftovers of killed saves removed ----------------


def _save_and_die(path: str, ckpt: str, where: str) -> None:
    """Save a checkpoint over ``ckpt`` and die (os._exit) at ``where``."""
    import shutil

    buf = persistent(path)
    buf.add_trajectories([make_traj(1)])
    if where == "between renames":  # a filesystem without RENAME_EXCHANGE
        localswap.exchange = lambda a, b: False
        rename = os.rename

        def dying(a, b):
            rename(a, b)
            if ".old-" in str(b):
                os._exit(9)

        localswap.os.rename = dying
    else:  # after the exchange, while removing the old tree
        localswap.shutil.rmtree = lambda *a, **k: os._exit(9)
    buf.save_checkpoint(ckpt)
    shutil.rmtree(path)  # not reached
    os._exit(0)


@pytest.mark.parametrize("where", ["between renames", "after exchange"])
def test_a_killed_checkpoint_replace_leaves_old_or_new_and_is_cleaned_up(tmp_path, where):
    ckpt = tmp_path / "ckpt"
    with persistent(tmp_path / "b") as buf:
        buf.add_trajectories([make_traj(0)])
        buf.save_checkpoint(str(ckpt))
    if where == "after exchange" and not localswap.exchange(tmp_path / "b", tmp_path / "b"):
        pytest.skip("no renameat2(RENAME_EXCHANGE) here")
    p = mp.get_context("spawn").Process(
        target=_save_and_die, args=(str(tmp_path / "b"), str(ckpt), where)
    )
    p.start()
    p.join(60)
    assert p.exitcode == 9
    leftovers = [n for n in os.listdir(tmp_path) if n.startswith(".ckpt.")]
    assert leftovers  # the old (or a removed half) tree, holding hard links to old data
    view = zreplay.open(ckpt)  # reopening finds the old checkpoint or the new, whole
    n = view.num_trajectories
    assert n in (1, 2)
    traj_equal(view.trajectory(0), make_traj(0))
    assert zreplay.verify(ckpt).ok
    with persistent(tmp_path / "b") as buf:  # the next save removes what the dead one left
        buf.save_checkpoint(str(ckpt))
    assert [n for n in os.listdir(tmp_path) if n.startswith(".ckpt.")] == []
    assert zreplay.open(ckpt).num_trajectories == 2


def test_leftovers_of_live_processes_are_kept(tmp_path):
    dest = tmp_path / "d"
    mine = localswap.stage_name(dest, localswap.PARTIAL)  # this process: alive
    mine.mkdir()
    foreign = tmp_path / ".d.partial-otherhost-1-abcdef12"
    foreign.mkdir()
    assert localswap.remove_leftovers(dest) == []
    assert mine.exists() and foreign.exists()


# -- S3 ---------------------------------------------------------------------------------


def test_s3_checkpoint_targets_are_guarded(url, s3):
    a = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=url, storage_options=s3, writer_id="a"
    )
    b = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=url, storage_options=s3, writer_id="b"
    )
    a.add_trajectories([make_traj(0)])
    b.add_trajectories([make_traj(1)])
    a.flush()
    b.flush()
    with pytest.raises(zreplay.DestinationError, match="source buffer itself"):
        a.save_checkpoint(url)
    with pytest.raises(zreplay.DestinationError, match="source buffer itself"):
        a.save_checkpoint(url.replace("s3://", "s3a://"))
    with pytest.raises(zreplay.DestinationError, match="lies inside"):
        a.save_checkpoint(url + "/segments/a/x")
    a.close()
    b.close()
    view = zreplay.open(url, storage_options=s3)
    assert view.num_trajectories == 2


def test_s3_checkpoint_replace_is_rolled_forward_after_a_crash(url, s3, monkeypatch):
    from zreplay.store import objectswap

    ckpt = url.rsplit("/", 1)[0] + "/ckpt"
    buf = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=url, storage_options=s3, sample_window_size=0
    )
    buf.add_trajectories([make_traj(0)])
    buf.save_checkpoint(ckpt)
    buf.add_trajectories([make_traj(1)])

    # A failure while building: the old checkpoint stays, nothing staged is left.
    real_commit = objectswap.roll_forward
    monkeypatch.setattr(
        "zreplay.store.checkpoint.write_commit",
        lambda *a, **k: (_ for _ in ()).throw(OSError(5, "injected")),
    )
    with pytest.raises(OSError, match="injected"):
        buf.save_checkpoint(ckpt)
    monkeypatch.undo()
    assert zreplay.open(ckpt, storage_options=s3).num_trajectories == 1
    # A crash half way through the roll forward (after the intent): reopening finishes it.
    calls = []

    def half(dest, name):
        calls.append(name)
        raise KeyboardInterrupt  # stands for the process dying here

    monkeypatch.setattr(objectswap, "roll_forward", half)
    with pytest.raises(KeyboardInterrupt):
        buf.save_checkpoint(ckpt)
    monkeypatch.setattr(objectswap, "roll_forward", real_commit)
    assert calls
    view = zreplay.open(ckpt, storage_options=s3)
    assert view.num_trajectories == 2
    traj_equal(view.trajectory(1), make_traj(1))
    assert zreplay.verify(ckpt, storage_options=s3).ok
    buf.close()
    import s3fs

    fs = s3fs.S3FileSystem(**s3)
    left = [k for k in fs.find(ckpt.split("://")[1]) if "staged-" in k or "swap.json" in k]
    assert left == [] and S3_BUCKET in ckpt


def test_paths_with_dotdot_work_everywhere(tmp_path, monkeypatch, capsys):
    """Defect 11: TensorStore refuses relative paths with '..'; every entry point took
    them as given (CorruptBufferError: Invalid file path; verify called it damaged)."""
    from zreplay.cli import main

    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path="../runs/buf") as buf:
        buf.add_trajectories([make_traj(0), make_traj(1)])
        buf.save_checkpoint("../runs/ckpt")
    view = zreplay.open("../runs/buf")
    assert view.num_trajectories == 2
    check_rows(view.sample(32))
    assert zreplay.verify("../runs/buf").ok and zreplay.verify("../runs/ckpt").ok
    assert zreplay.open("../runs/ckpt").num_trajectories == 2
    assert main(["info", "../runs/buf"]) == 0
    assert main(["verify", "../runs/ckpt"]) == 0
    capsys.readouterr()


def test_leftovers_of_live_processes_in_other_pid_namespaces_are_kept(tmp_path):
    """A staging tree named by a process of another PID namespace on this host (its pid
    is dead or ours here) is kept while its maker holds its flock, removed once not."""
    from zreplay.store import liveness

    dest = tmp_path / "d"
    host, ids, _ = liveness.process_tag().rsplit("-", 2)
    other = f"{host}-{ids[:8]}0123abcd"  # this kernel, another PID namespace
    live = tmp_path / f".d.partial-{other}-{os.getpid()}-aaaaaaaa"  # its pid is ours here
    dead = tmp_path / f".d.partial-{other}-{2**22 + 9}-bbbbbbbb"
    live.mkdir()
    dead.mkdir()
    held = liveness.hold(live)
    past = time.time() - 2 * liveness.MAKING_GRACE_S  # made long ago (see the next test)
    for p in (live, dead):
        os.utime(p, (past, past))
    try:
        assert localswap.remove_leftovers(dest) == [dead]
        assert live.exists() and not dead.exists()
    finally:
        held.release()
    assert localswap.remove_leftovers(dest) == [live]  # its maker let go (died)


def test_a_tree_a_dead_replace_of_another_pid_namespace_moved_aside_is_put_back_at_once(
    tmp_path,
):
    """Where a replace has no rename exchange it moves the old tree aside, held (its
    flock moves with it), then moves the new one in; dying between the two leaves no
    tree at the path. The old one is put back at once, young as it is: only a staging
    tree has a moment between its making and its flock to wait out."""
    from zreplay.store import liveness

    dest = tmp_path / "d"
    host, ids, _ = liveness.process_tag().rsplit("-", 2)
    old = tmp_path / f".d.old-{host}-{ids[:8]}0123abcd-{2**22 + 9}-dddddddd"
    old.mkdir()
    (old / "f").write_text("the buffer")
    assert localswap.restore(dest)
    assert (dest / "f").read_text() == "the buffer" and not old.exists()


def test_a_sibling_destinations_staging_tree_is_not_taken_for_an_old_tree(tmp_path):
    """``.d.old-x.partial-<tag>-<hex>`` is the staging tree of a destination named
    ``d.old-x``, beside ``d``: never put in place of ``d``, however it is judged."""
    from zreplay.store import liveness

    dest = tmp_path / "d"
    host, ids, _ = liveness.process_tag().rsplit("-", 2)
    tag = f"{host}-{ids[:8]}0123abcd-{2**22 + 9}"  # this kernel, another PID namespace
    sibling = tmp_path / f".d.old-x.partial-{tag}-eeeeeeee"
    sibling.mkdir()
    (sibling / "f").write_text("the sibling's new tree")
    assert not localswap.restore(dest)
    assert not dest.exists() and sibling.exists()
    assert localswap.remove_leftovers(dest) == [] and sibling.exists()


def test_a_staging_tree_just_made_in_another_pid_namespace_is_kept_before_its_flock(tmp_path):
    """Its maker makes the tree, then takes its flock: a look in between (another PID
    namespace's maker, so only the flock can tell) keeps a young tree, and removes it
    once it is older than any such moment (its maker died there)."""
    from zreplay.store import liveness

    dest = tmp_path / "d"
    host, ids, _ = liveness.process_tag().rsplit("-", 2)
    young = tmp_path / f".d.partial-{host}-{ids[:8]}0123abcd-{2**22 + 9}-cccccccc"
    young.mkdir()  # (its maker's flock not taken yet)
    assert localswap.remove_leftovers(dest) == []
    past = time.time() - 2 * liveness.MAKING_GRACE_S
    os.utime(young, (past, past))
    assert localswap.remove_leftovers(dest) == [young]
