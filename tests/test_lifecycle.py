"""Every facade shares one lifecycle: a buffer the program drops (and the garbage
collector frees) commits what it holds and releases its writer lock, so running a
notebook cell again after ``del buf`` (or reassigning the name) reopens the path."""

from __future__ import annotations

import gc
import time
from contextlib import closing
from pathlib import Path

import builders
import numpy as np
import pytest
import torch
from conftest import check_rows, codes_of, make_traj, traj_equal
from test_all_or_nothing import persistent as unwindowed
from test_rlinf import persistent

import zreplay
from zreplay import BufferClosedError


def _gone(make, reopen, count):
    buf = make()
    del buf
    gc.collect()
    again = reopen()  # raised WriterLockedError for two of the three facades
    try:
        assert count(again) == 1
    finally:
        again.close()


def test_a_dropped_trajectory_buffer_commits_and_lets_go(tmp_path):
    path = str(tmp_path / "b")

    def make():
        buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path)
        buf.add_trajectories([make_traj(0)])  # not flushed
        return buf

    _gone(make, lambda: zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path), len)


def test_a_dropped_episode_buffer_commits_and_lets_go(tmp_path):
    path = tmp_path / "b"

    def make():
        rb = zreplay.ReplayBuffer(100, path=path)
        rb.write_episode({"obs": np.zeros((5, 3), np.float32)})
        return rb

    _gone(make, lambda: zreplay.ReplayBuffer(100, path=path), lambda rb: rb.num_episodes)


def test_a_dropped_torchrl_storage_commits_and_lets_go(tmp_path):
    from tensordict import TensorDict
    from torchrl.data import TensorDictReplayBuffer

    from zreplay.torchrl import ZarrStorage

    path = tmp_path / "b"

    def make():
        rb = TensorDictReplayBuffer(storage=ZarrStorage(100, path), batch_size=4)
        rb.extend(TensorDict({"x": torch.ones(10, 3)}, batch_size=[10]))
        return rb

    _gone(make, lambda: ZarrStorage(100, path), lambda s: len(s) // 10)


def test_a_dropped_learner_view_says_it_stopped(tmp_path):
    path = str(tmp_path / "b")
    with closing(builders.writer(path)) as buf:
        builders.add_full(buf, [0])
    view = zreplay.open(path, rate_limiter=zreplay.MinSize(1), learner_id="L")
    view.sample(4)
    del view
    gc.collect()
    _wait_stopped(path, None, "L")


def _wait_stopped(path, options, learner: str, within_s: float = 20.0) -> None:
    """The learner's progress says it stopped, within ``within_s`` (a dropped view
    closes on a thread of its own)."""
    from zreplay.store.location import locate
    from zreplay.store.progress import read_progress

    deadline = time.monotonic() + within_s
    while not read_progress(locate(path, options), learner).closed:
        assert time.monotonic() < deadline, f"learner {learner} never said it stopped"
        time.sleep(0.05)


def test_a_learner_view_collected_on_the_s3_event_loop_closes_without_a_hang(s3, url):
    """The garbage collector may run a dropped view's finalizer on the S3 client's own
    event-loop thread; closing there published the learner's progress through that
    loop and waited on itself, and every later S3 request of the process hung."""
    import threading

    from zreplay.store.objectio import shared_loop

    with closing(builders.writer(url, storage_options=s3)) as buf:
        builders.add_full(buf, [0])
    held = [zreplay.open(url, storage_options=s3, rate_limiter=zreplay.MinSize(1), learner_id="L")]
    held[0].sample(4)

    async def drop_here():  # runs on the loop's thread: the collection happens there
        held.clear()
        gc.collect()

    t = threading.Thread(target=lambda: shared_loop().run(drop_here()), daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "the S3 event loop hung closing a view collected on it"
    _wait_stopped(url, s3, "L")
    with zreplay.open(url, storage_options=s3) as again:  # S3 requests still go through
        assert again.sample(2)["rewards"].shape[0] == 2


def test_a_blocking_s3_request_on_the_loops_own_thread_fails_instead_of_hanging(s3):
    from zreplay.store.objectio import LoopReentryError, shared_loop

    loop = shared_loop()

    async def inner():
        return 1

    async def nested():
        return loop.run(inner())

    got = []

    def call():
        try:
            loop.run(nested())
        except LoopReentryError as e:
            got.append(e)

    t = __import__("threading").Thread(target=call, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive() and got, "a request on the loop's own thread waited on itself"


def test_a_buffer_dropped_inside_its_own_call_closes_without_a_deadlock(tmp_path):
    """A hook drops the last reference to its buffer during a sample: the finalizer
    closed it on that thread, which held the writer's lock the close waited on."""
    import threading

    class Holder:
        pass

    h = Holder()

    def hook(step, buffer, batch_size, history_len):
        h.buf = None  # the program lets go of the buffer here
        return np.zeros(batch_size, np.int64)

    path = str(tmp_path / "b")
    h.buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path, sampler=hook)
    h.buf.add_trajectories([make_traj(0)])
    cores, got = [h.buf.core], []
    t = threading.Thread(target=lambda: got.append(cores[0].sample(4)), daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "sample() blocked: the dropped buffer closed on its own lock"
    cores.clear()
    gc.collect()
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path) as again:
        assert len(again) == 1  # closed by then, or waited for


def test_a_dropped_prefetcher_lets_its_buffer_go(tmp_path):
    path = str(tmp_path / "b")
    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path)
    buf.add_trajectories([make_traj(0)])
    pf = buf.prefetch(4)
    next(pf)
    buf.add_trajectories([make_traj(1)])
    del buf, pf
    gc.collect()
    import time

    time.sleep(0.5)  # its thread stops within a tenth of a second, then lets go
    gc.collect()
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path) as again:
        assert len(again) == 2


def test_a_torchrl_buffer_dropped_after_loading_a_full_ring_keeps_its_writers_cursor(tmp_path):
    """Dropped (not closed) before its first extend, the storage lost the cursor the
    restored writer had: the next extend overwrote recent rows, not the oldest."""
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    from zreplay.torchrl import ZarrStorage

    def rows(start, n):
        return TensorDict({"g": torch.arange(start, start + n)}, [n])

    ref = TensorDictReplayBuffer(storage=LazyTensorStorage(8), batch_size=4)
    ref.extend(rows(0, 11))  # a full ring, next slot 3
    rb = TensorDictReplayBuffer(storage=ZarrStorage(8, tmp_path / "z"), batch_size=4)
    rb.load_state_dict(ref.state_dict())
    del rb
    gc.collect()
    again = TensorDictReplayBuffer(storage=ZarrStorage(8, tmp_path / "z"), batch_size=4)
    for r in (ref, again):
        r.extend(rows(100, 2))
    assert again.storage[:]["g"].tolist() == ref.storage[:]["g"].tolist()
    again.storage.close()


def test_a_learner_view_left_open_at_exit_publishes_its_count_and_stop(tmp_path):
    """The program ends with a learner view open: its finalizer runs at exit, when no
    thread it starts would be waited for, so the view closes there and then."""
    import subprocess
    import sys
    import textwrap

    from zreplay.store.location import locate
    from zreplay.store.progress import read_progress

    path = str(tmp_path / "b")
    child = textwrap.dedent(
        f"""
        import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})
        import builders, zreplay
        w = builders.writer({path!r})
        builders.add(w, 0, T=50, B=4, keys={{"obs": (3,), "rewards": ()}})
        w.close()
        lim = zreplay.SampleToInsertRatio(1.0, min_size_to_sample=1, error_buffer=1e9,
                                          publish_every_s=1e9)
        v = zreplay.open({path!r}, rate_limiter=lim, learner_id="L")
        v.sample(5)
        """
    )
    for _ in range(3):
        got = subprocess.run([sys.executable, "-c", child], capture_output=True, timeout=120)
        assert got.returncode == 0, got.stderr[-2000:]
        p = read_progress(locate(path), "L")
        assert p.closed, "the learner's stop was lost at exit"
    assert p.samples == 15  # three runs of 5, each resumed from the last


def test_a_dropped_learner_view_has_published_its_count_before_a_reopen(tmp_path):
    """Dropped, a learner view closes on a thread of its own; a view declared again
    under the same learner id waits for that close, so it resumes the final count and no
    late "stopped" lands after it."""
    from zreplay.store.location import locate
    from zreplay.store.progress import read_progress

    path = str(tmp_path / "b")
    with closing(builders.writer(path)) as buf:
        builders.add_full(buf, [0])
    lim = zreplay.SampleToInsertRatio(1.0, min_size_to_sample=1, error_buffer=1e9)
    view = zreplay.open(path, rate_limiter=lim, learner_id="L")
    view.sample(7)
    del view
    gc.collect()
    again = zreplay.open(path, rate_limiter=lim, learner_id="L")  # waits for the close
    assert not read_progress(locate(path), "L").closed  # the reopened learner is live
    again.sample(3)
    again.close()
    assert read_progress(locate(path), "L").samples == 10


HALF_CONSUMED_DATASET = """
import sys, zreplay
it = iter(zreplay.ReplayDataset(zreplay.open(sys.argv[1]), 1024))
for _ in range(3):
    next(it)
print("done")  # exit with the iterator (and its prefetch thread) still alive
"""


@pytest.mark.slow  # a multi-process soak: python -m pytest -m slow
def test_a_half_consumed_replay_dataset_does_not_abort_the_process_at_exit(tmp_path):
    """Defect 12: the prefetch thread was still inside a TensorStore read when native
    libraries shut down (``terminate called without an active exception``, status 134,
    about 7 runs in 10 on this workload before the fix)."""
    import subprocess
    import sys

    rng = np.random.default_rng(0)
    with unwindowed(tmp_path / "b") as buf:
        for _ in range(10):
            obs = rng.integers(0, 255, (50, 8, 84, 84, 3), dtype=np.uint8)
            buf.add_trajectories([{"rewards": np.ones((50, 8, 1), np.float32), "obs": obs}])
    for _ in range(6):
        done = subprocess.run(
            [sys.executable, "-c", HALF_CONSUMED_DATASET, str(tmp_path / "b")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-2000:]


def test_close_reopen_resumes_everything(bufpath):
    trajs = [make_traj(i, epochs=2) for i in range(5)]
    with persistent(bufpath) as buf:
        ids = buf.add_trajectories(trajs)
    assert ids == list(range(5))
    with persistent(bufpath) as buf:
        assert len(buf) == 5 and buf.total_samples == 5 * 18
        for i, t in enumerate(trajs):
            got = buf.trajectory(i)
            traj_equal(got, t)
            assert got["max_episode_length"] == 100 + i
        check_rows(buf.sample(100))
        assert buf.add_trajectories([make_traj(5)]) == [5]  # ids continue


def test_resume_continues_the_same_random_stream(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"

    def draws(core):
        return [builders.tids(core.sample(16)["obs"]) for _ in range(3)]

    never_closed = builders.writer(a, seed=7)
    for tid in range(4):
        builders.add(never_closed, tid)
    never_closed.sample(10)
    want = draws(never_closed)
    never_closed.close()
    core = builders.writer(b, seed=7)
    for tid in range(4):
        builders.add(core, tid)
    core.sample(10)
    core.close()
    core = builders.writer(b, seed=999)  # the saved stream wins over the seed
    got = draws(core)
    core.close()
    for w, g in zip(want, got, strict=True):
        assert np.array_equal(w, g)


def test_overwrite_starts_fresh(bufpath):
    with persistent(bufpath) as buf:
        buf.add_trajectories([make_traj(0)])
    with persistent(bufpath, overwrite=True) as buf:
        assert len(buf) == 0


def test_close_is_idempotent_and_use_after_close_raises(bufpath):
    buf = persistent(bufpath)
    buf.add_trajectories([make_traj(0)])
    buf.close()
    buf.close()
    with pytest.raises(BufferClosedError, match="closed"):
        buf.add_trajectories([make_traj(1)])
    with pytest.raises(BufferClosedError):
        buf.sample(1)
    with pytest.raises(BufferClosedError):
        buf.flush()


def test_in_memory_buffer_works_fully_and_leaves_nothing(tmp_path):
    buf = zreplay.TrajectoryReplayBuffer(seed=1, auto_save=False, sample_window_size=3)
    path = buf.path
    buf.add_trajectories([make_traj(i) for i in range(6)])
    assert set(codes_of(buf.sample(300)) // 10000) == {3, 4, 5}
    buf.sample_window_size = 0
    # Unlike RLinf, trajectories that left the RAM tier are still sampleable.
    assert set(codes_of(buf.sample(3000)) // 10000) == set(range(6))
    buf.save_checkpoint(str(tmp_path / "ck"))
    buf.close()
    assert not path.exists()
    assert zreplay.open(tmp_path / "ck").num_trajectories == 6
