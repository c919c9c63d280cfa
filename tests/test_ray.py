"""Ray as the distributed engine (RLinf's rollout and actor workers are Ray actors):
actors append to their own segments of one buffer (local directory and S3 on moto), a
learner in the driver samples the union with refresh(); buffers and views handed to Ray
tasks travel as their location and options, never their data; an actor killed with
ray.kill mid-write loses nothing it flushed."""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import check_rows, make_traj, traj_equal

import zreplay

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_local():
    # Workers inherit the environment of the cluster ray.init starts here: they import
    # this module (and conftest) by name, as the driver does.
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), old]))
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=80 << 20,
        configure_logging=False,
    )
    yield
    ray.shutdown()
    if old is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old


@ray.remote(num_cpus=0)
class Rollout:
    """A rollout actor: its own writer segment of the shared buffer."""

    def __init__(self, path: str, options: dict | None, writer_id: str):
        self.buf = zreplay.TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=path, storage_options=options, writer_id=writer_id
        )

    def pid(self) -> int:
        return os.getpid()

    def add(self, tids: list[int]) -> int:
        """Add and flush: when this returns, the trajectories are committed."""
        self.buf.add_trajectories([make_traj(t) for t in tids])
        self.buf.flush()
        return len(self.buf)

    def add_forever(self, first: int) -> None:
        """Keep adding (commits in flight all the time) until killed."""
        t = first
        while True:
            self.buf.add_trajectories([make_traj(t, T=16, B=4)])
            t += 1
            if t % 3 == 0:
                self.buf.flush()

    def close(self) -> None:
        self.buf.close()


@ray.remote(num_cpus=0)
def sample_in_task(view, n: int):
    """What a Ray task makes of a view or buffer it was handed."""
    batch = view.sample(n)
    return type(view).__name__, view.num_rows, check_rows(batch), hasattr(view, "add_trajectories")


def tid_of(traj: dict) -> int:
    return int(np.asarray(traj["actions"]).flat[0]) // 10000


@pytest.mark.slow  # a multi-process soak: python -m pytest -m slow
@pytest.mark.usefixtures("ray_local")
def test_actors_write_segments_a_learner_samples_the_union(shared_location):
    path, opts = shared_location
    actors = [Rollout.remote(path, opts, f"actor{i}") for i in range(2)]
    assert ray.get([a.add.remote([100 * i, 100 * i + 1]) for i, a in enumerate(actors)]) == [2, 2]
    learner = zreplay.open(path, storage_options=opts, seed=0)  # in the driver
    assert learner.num_trajectories == 4
    ray.get([a.add.remote([100 * i + 2, 100 * i + 3]) for i, a in enumerate(actors)])
    assert learner.num_trajectories == 4  # until it refreshes
    assert learner.refresh()
    assert learner.writer_ids == ["actor0", "actor1"]
    tids = sorted(tid_of(learner.trajectory(i)) for i in range(learner.num_trajectories))
    assert tids == [0, 1, 2, 3, 100, 101, 102, 103]
    # bit-exact (on S3 one trajectory of each actor: moto answers slowly)
    for i in range(learner.num_trajectories) if opts is None else (0, 7):
        t = learner.trajectory(i)
        traj_equal(t, make_traj(tid_of(t)))
    codes = check_rows(learner.sample(512))
    assert set(codes // 10000) == set(tids)
    ray.get([a.close.remote() for a in actors])
    for a in actors:
        ray.kill(a)


@pytest.mark.usefixtures("ray_local")
def test_buffers_and_views_travel_as_their_location(tmp_path):
    path = str(tmp_path / "buf")
    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path, seed=0)
    buf.add_trajectories([make_traj(t, T=50, B=8) for t in range(4)])  # ~3 MB of rows
    view = zreplay.open(path)
    # no data in the pickles: a few hundred bytes, whatever the buffer holds
    assert len(pickle.dumps(view)) < 2000
    assert len(ray.cloudpickle.dumps(buf)) < 2000
    name, rows, codes, writable = ray.get(sample_in_task.remote(view, 64))
    assert (name, rows, writable) == ("BufferView", 4 * 400, False)
    assert set(codes // 10000) <= set(range(4))
    # a writer stays in its process: the task gets a read-only view of what it committed
    buf.add_trajectories([make_traj(4, T=50, B=8)])  # pickling flushes first
    name, rows, codes, writable = ray.get(sample_in_task.remote(buf, 64))
    assert (name, rows, writable) == ("BufferView", 5 * 400, False)
    # the window sampler went along: RLinf's default draws from the last 100 trajectories
    assert pickle.loads(pickle.dumps(buf)).sampler.size == 100
    buf.close()
    tmp = zreplay.TrajectoryReplayBuffer()
    with pytest.raises(TypeError, match="auto_save_path"):
        pickle.dumps(tmp)
    tmp.close()


def _wait_dead(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"actor process {pid} still alive")


@pytest.mark.slow  # a multi-process soak: python -m pytest -m slow
@pytest.mark.usefixtures("ray_local")
def test_an_actor_killed_mid_write_loses_nothing_it_flushed(shared_location):
    path, opts = shared_location
    actor = Rollout.remote(path, opts, "actor0")
    pid = ray.get(actor.pid.remote())
    flushed = [0, 1, 2]
    for t in flushed:
        ray.get(actor.add.remote([t]))
    actor.add_forever.remote(3)
    view = zreplay.open(path, storage_options=opts)
    deadline = time.monotonic() + 60
    while view.num_trajectories < 5:  # commits are in flight now
        assert time.monotonic() < deadline
        time.sleep(0.05)
        view.refresh()
    ray.kill(actor)
    _wait_dead(pid)
    view.refresh()
    got = {tid_of(view.trajectory(i)): view.trajectory(i) for i in range(view.num_trajectories)}
    assert set(flushed) <= set(got)
    for t, traj in got.items():  # flushed or not, whatever is visible is whole and exact
        traj_equal(traj, make_traj(t) if t in flushed else make_traj(t, T=16, B=4))
    assert sorted(got) == list(range(len(got)))  # committed in order, no gaps
    # the next writer of the segment takes over the dead actor's lock and goes on
    buf = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=path, storage_options=opts, writer_id="actor0"
    )
    assert len(buf) == len(got)
    buf.add_trajectories([make_traj(1000)])
    buf.close()
    assert zreplay.open(path, storage_options=opts).num_trajectories == len(got) + 1


@pytest.mark.slow  # a multi-process soak: python -m pytest -m slow
@pytest.mark.usefixtures("ray_local")
def test_the_rlinf_shaped_example_runs(tmp_path):
    """examples/ray_actors.py end to end (tiny shapes) on this Ray cluster: two rollout
    actors, a rate-limited, staleness-aware learner in the driver."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "examples" / "ray_actors.py"
    spec = importlib.util.spec_from_file_location("ray_actors", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    args = ["--path", str(tmp_path / "buf"), "--actors", "2", "--rollouts", "4", "--T", "5"]
    args += ["--B", "2", "--img", "8", "--batch", "16", "--update-every", "3"]
    got = example.main([*args, "--samples-per-insert", "2", "--max-staleness", "1"])
    assert got["rows"] == 2 * 4 * 5 * 2  # every actor's trajectories, all committed
    assert got["learner_batches"] > 0 and got["stale_rows_drawn"] == 0
    # rate-limited at 2 samples per row, within the error buffer (4 trajectories' rows)
    assert got["learner_batches"] * 16 <= 2 * got["rows"] + 2 * 4 * 10
