"""zreplay.open(): a read-only, dataset-like view (what plain zarr reads of a buffer:
test_plain_zarr.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from contextlib import closing

import builders
import numpy as np
import pytest
from conftest import check_rows, traj_equal

import zreplay
from zreplay.core import Prepared


def test_view_basics(written):
    path, trajs = written
    v = zreplay.open(path, seed=0)
    assert v.num_trajectories == 4 and v.num_rows == sum((3 + i) * 2 for i in range(4))
    assert "curr_obs/main_images" in v.keys() and len(v) == v.num_rows
    s = v.sample(50)
    assert isinstance(s["actions"], np.ndarray) and s["curr_obs"]["main_images"].dtype == np.uint8
    check_rows(s)
    for i, t in enumerate(trajs):
        traj_equal(v.trajectory(i), t)
    assert v[0]["actions"].shape == (6,)
    with pytest.raises(IndexError):
        v.trajectory(4)


def test_refresh_sees_commits_from_another_process(written):
    path, _ = written
    v = zreplay.open(path)
    code = textwrap.dedent(
        f"""
        import sys; sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
        from contextlib import closing
        import builders
        with closing(builders.writer({path!r})) as b:
            builders.add_full(b, range(4, 7))
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert v.num_trajectories == 4
    assert v.refresh() is True
    assert v.num_trajectories == 7 and v.trajectory(6)["trajectory_id"] == 6
    assert v.refresh() is False


def test_view_of_empty_and_non_buffer(tmp_path):
    builders.writer(tmp_path / "e").close()
    v = zreplay.open(tmp_path / "e")
    assert v.num_rows == 0 and v.keys() == []
    with pytest.raises(zreplay.EmptyBufferError):
        v.sample(1)
    with pytest.raises(zreplay.FormatError):
        zreplay.open(tmp_path)


def test_zarr_fallback_reads_never_fail_while_the_writer_replaces_shards(tmp_path):
    """Forked readers use zarr-python, which opens a shard twice per read (index, chunk):
    a read straddling the writer's atomic shard replacement is retried, never an error."""
    import threading
    import time

    from zreplay.store import arrays as Z

    rb = zreplay.ReplayBuffer(100_000, path=tmp_path / "s", durable=False)

    def ep(i):
        return {
            "pixels": np.full((5, 8, 8), i % 250, np.uint8),
            "reward": np.full(5, i, np.float32),
        }

    rb.write_episode(ep(0))
    rb.flush()
    stop = threading.Event()

    def writer():
        i = 1
        while not stop.is_set():
            rb.write_episode(ep(i))
            rb.flush()
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    arr = Z.ZarrArray(rb.path / "segments" / "default" / "data" / "pixels")
    reads, t0 = 0, time.monotonic()
    try:
        while time.monotonic() - t0 < 3:
            assert (Z.ZarrIO(arr._arr, np.arange(5)).read().result() == 0).all()
            reads += 1
    finally:
        stop.set()
        t.join()
        rb.close()
    assert reads > 50


def test_views_and_clip_datasets_keep_rlinf_actions_dense_under_frameskip(bufpath):
    """The buffer, its view and ClipDataset agree: "actions" (RLinf's name) is an action
    column, kept dense between strided frames (adversarial pass)."""
    b = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=bufpath, seed=0)
    b.add_trajectories(
        [
            {
                "actions": np.arange(40, dtype=np.float32).reshape(10, 1, 4),
                "rewards": np.zeros((10, 1), np.float32),
            }
        ]
    )
    own = b.sample_clips(2, history_len=2, frameskip=3)["actions"]
    b.close()
    view = zreplay.open(bufpath, seed=0).sample_clips(2, history_len=2, frameskip=3)["actions"]
    item = zreplay.ClipDataset(bufpath, history_len=2, frameskip=3)[0]["actions"]
    assert tuple(own.shape) == (2, 2, 3 * 4)
    assert tuple(view.shape) == tuple(own.shape) and tuple(item.shape) == (2, 3 * 4)
    assert np.asarray(item)[0].tolist() == list(range(12))  # three steps' actions in a row


# -- a view is a snapshot until refresh(), in every method -----------------------------


def _coded(v: float, T: int = 10, B: int = 2) -> dict:
    """A trajectory whose every value is ``v`` (which contents a read came from)."""
    done = np.zeros((T, B, 1), bool)
    done[-1] = True
    return {
        "rewards": np.full((T, B, 1), v, np.float32),
        "actions": np.full((T, B, 2), v, np.float32),
        "frame": np.full((T, B, 24, 24, 3), int(v), np.uint8),  # > 1 KiB: not cached
        "terminations": done,
    }


def _add_coded(core, *values: float) -> None:
    """Add a :func:`_coded` trajectory of each of ``values`` to a core."""
    core.add([Prepared(_coded(v), 10, 2) for v in values])


def _replace_contents(how: str, path: str, ckpt: str) -> None:
    """Replace the 40 rows (value 1) at ``path`` by 20 rows of value 2, ``how``."""
    if how == "restart":  # the writer starts the buffer afresh
        with zreplay.TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=path, overwrite=True
        ) as buf:
            buf.add_trajectories([_coded(2.0)])
        return
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path) as buf:
        if how == "clear":
            buf.clear()
            buf.add_trajectories([_coded(2.0)])
        else:
            with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=ckpt) as other:
                other.add_trajectories([_coded(2.0)])
                other.save_checkpoint(ckpt + "_saved")
            buf.load_checkpoint(ckpt + "_saved")
        buf.flush()


@pytest.mark.parametrize("cache", [0, None])
@pytest.mark.parametrize("how", ["clear", "load_checkpoint", "restart"])
def test_a_view_is_a_snapshot_until_refresh_after_its_rows_are_replaced(tmp_path, how, cache):
    """Once a writer replaced the 40 rows a view shows with 20 others, the view still
    says 40 rows in every method, and a positional read returns the snapshot's rows or
    raises StaleViewError: never the new rows at the old positions, never IndexError."""
    path = str(tmp_path / "buf")
    with closing(builders.writer(path)) as buf:
        _add_coded(buf, 1.0, 1.0)
    view = zreplay.open(path, seed=0, column_cache_bytes=cache)
    view.sample(4)  # the column cache (when on) now holds the old rows
    before = (len(view), view.num_trajectories, view.num_episodes, view.keys())
    table = view.episode_table()
    _replace_contents(how, path, str(tmp_path / "other"))

    def snapshot_or_stale(read):
        try:
            got = read()
        except zreplay.StaleViewError as e:
            assert "refresh()" in str(e)
            return
        values = [np.asarray(got[k]) for k in ("rewards", "actions", "frame") if k in got]
        assert values and all(np.all(x == 1) for x in values), values

    assert (len(view), view.num_trajectories, view.num_episodes, view.keys()) == before
    assert all(np.array_equal(table[k], view.episode_table()[k]) for k in table)
    assert view.num_clips(2) == 2 * 2 * 9 and len(view.episodes()) == 4
    for i in (0, 19, 20, 39):
        snapshot_or_stale(lambda i=i: view[i])
    snapshot_or_stale(lambda: view.rows([5, 25, 39], keys=["rewards", "frame"]))
    snapshot_or_stale(lambda: view.trajectory(1))
    snapshot_or_stale(lambda: view.episode(3))
    snapshot_or_stale(lambda: view.clips([30], 2))
    snapshot_or_stale(lambda: list(view.core.trajectories())[1].columns)
    # A random draw whose rows went is drawn again on a refreshed snapshot: the whole
    # view then shows it, never a mix.
    s = view.sample(16, keys=["rewards", "frame"])
    if np.all(s["rewards"] == 1):
        assert len(view) == 40
    else:
        assert np.all(s["rewards"] == 2) and np.all(s["frame"] == 2) and len(view) == 20
    view.refresh()
    assert len(view) == 20 and view.num_trajectories == 1 and view.num_episodes == 2
    assert view[19]["rewards"] == 2 and np.all(view.trajectory(0)["rewards"] == 2)
    with pytest.raises(IndexError):
        view[20]


def test_a_view_keeps_its_rows_across_a_writer_restart_that_appends(tmp_path):
    """A writer that reopens the buffer and appends leaves the view's rows in place: the
    view keeps serving them until refresh()."""
    path = str(tmp_path / "buf")
    with closing(builders.writer(path)) as buf:
        _add_coded(buf, 1.0, 1.0)
    view = zreplay.open(path)
    with closing(builders.writer(path)) as buf:
        _add_coded(buf, 2.0)
    assert len(view) == 40 and view[39]["rewards"] == 1 and view.num_trajectories == 2
    assert np.all(view.rows(np.arange(40), keys=["frame"])["frame"] == 1)
    view.refresh()
    assert len(view) == 60 and view[59]["rewards"] == 2


# -- positions as numpy reads them -----------------------------------------------------


def test_view_positions_read_as_numpy_indexes_an_array(tmp_path):
    """A boolean mask of num_rows selects rows; negative positions count from the end in
    every positional method; float positions are refused (never truncated); numpy and
    torch integers work; out of range is IndexError."""
    import torch

    path = str(tmp_path / "buf")
    with closing(builders.writer(path)) as buf:
        _add_coded(buf, 1.0, 2.0)
    view = zreplay.open(path)
    r = view.rows(np.arange(40), keys=["rewards"])["rewards"][:, 0]
    mask = np.zeros(40, bool)
    mask[[3, 25]] = True
    assert np.array_equal(view.rows(mask, keys=["rewards"])["rewards"][:, 0], r[[3, 25]])
    assert len(view.rows(list(mask), keys=["rewards"])["rewards"]) == 2
    assert view[-1]["rewards"] == r[39] == view[39]["rewards"]
    assert view[-40]["rewards"] == r[0]
    got = view.rows([-1, -40, np.int64(5)], keys=["rewards"])["rewards"][:, 0]
    assert np.array_equal(got, r[[39, 0, 5]])
    assert np.array_equal(
        view.rows(torch.tensor([1, -2]), keys=["rewards"])["rewards"][:, 0], r[[1, 38]]
    )
    assert view[np.int32(7)]["rewards"] == r[7] and view[torch.tensor(8)]["rewards"] == r[8]
    assert view.rows([], keys=["rewards"])["rewards"].shape == (0, 1)
    assert np.array_equal(view.trajectory(-1)["rewards"], view.trajectory(1)["rewards"])
    assert np.array_equal(view.episode(-1)["rewards"], view.episode(3)["rewards"])
    n = view.num_clips(2)
    assert np.array_equal(view.clips([-1], 2)["rewards"], view.clips([n - 1], 2)["rewards"])
    for bad in ([0.5, 1.7], np.array([3.0]), torch.tensor([2.0])):
        with pytest.raises(TypeError, match="integers"):
            view.rows(bad)
    with pytest.raises(TypeError, match="integer"):
        view[1.0]
    with pytest.raises(TypeError):
        view.clips([0.5], 2)
    with pytest.raises(IndexError, match="shape"):
        view.rows(mask[:10])
    for bad in (40, -41):
        with pytest.raises(IndexError):
            view[bad]
        with pytest.raises(IndexError):
            view.rows([0, bad])
    with pytest.raises(IndexError):
        view.clips([n], 2)


def test_trajectory_buffer_and_view_read_trajectory_positions_alike(tmp_path):
    """The writer facade and the view both count trajectory -1 as the newest, refuse a
    float and raise IndexError past either end."""
    path = str(tmp_path / "buf")
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path) as buf:
        buf.add_trajectories([_coded(1.0), _coded(2.0)])
        buf.flush()
        view = zreplay.open(path)
        for src in (buf, view):
            assert np.all(src.trajectory(-1)["rewards"] == 2)
            assert np.all(src.trajectory(np.int64(-2))["rewards"] == 1)
            with pytest.raises(TypeError):
                src.trajectory(1.0)
            for bad in (2, -3):
                with pytest.raises(IndexError):
                    src.trajectory(bad)
