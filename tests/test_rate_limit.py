"""Rate limiting between writers and learners of one shared buffer (Reverb's MinSize and
SampleToInsertRatio), with no server: learners wait for rows, writers wait for learners
that declared themselves, counts come from the commit records and learner progress
files; across real processes, on local disk and on S3 (moto), and across restarts."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
import zarr
from conftest import check_rows, make_traj, run_children

import zreplay
from zreplay import MinSize, SampleToInsertRatio
from zreplay.errors import EmptyBufferError, RateLimitTimeout
from zreplay.store.progress import read_progress

ROWS = 18  # make_traj: T=6, B=3


def writer(loc, wid="w0", **kw):
    path, opts = loc
    return zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=path, storage_options=opts, writer_id=wid, **kw
    )


def empty_buffer(loc) -> None:
    writer(loc, wid="setup").close()


@pytest.fixture
def loc(tmp_path):
    return str(tmp_path / "buf.zarr"), None


def test_min_size_holds_learners_back_until_enough_rows(loc):
    empty_buffer(loc)
    view = zreplay.open(loc[0], rate_limiter=MinSize(2 * ROWS, timeout_s=0.2))
    w = writer(loc)
    w.add_trajectories([make_traj(0)])
    w.flush()
    with pytest.raises(RateLimitTimeout, match="fewer than min_size_to_sample=36"):
        view.sample(4)
    view = zreplay.open(loc[0], rate_limiter=MinSize(2 * ROWS, timeout_s=20))
    threading.Timer(0.4, lambda: (w.add_trajectories([make_traj(1)]), w.flush())).start()
    t0 = time.monotonic()
    check_rows(view.sample(64))  # waited for the second trajectory, then saw it
    assert time.monotonic() - t0 >= 0.3
    w.close()


def test_a_learner_ahead_of_the_ratio_waits_for_inserts(loc):
    empty_buffer(loc)
    lim = SampleToInsertRatio(2.0, ROWS, error_buffer=10, timeout_s=0.2)
    view = zreplay.open(loc[0], rate_limiter=lim, learner_id="L")  # joins an empty buffer
    w = writer(loc)
    w.add_trajectories([make_traj(0), make_traj(1)])
    w.flush()
    # diff = 36 inserted * 2 - samples must stay >= 2 * 18 - 10 = 26: 46 samples allowed
    view.sample(40)
    view.sample(6)
    with pytest.raises(RateLimitTimeout, match="learner 'L' has drawn 46 samples for 36"):
        view.sample(1)
    w.add_trajectories([make_traj(2)])
    w.flush()
    view.sample(36)  # 18 more rows: 36 more samples
    with pytest.raises(RateLimitTimeout):
        view.sample(1)
    w.close()


def test_a_writer_ahead_of_a_declared_learner_waits(loc):
    empty_buffer(loc)
    lim = SampleToInsertRatio(1.0, ROWS, error_buffer=2 * ROWS, timeout_s=0.3, publish_every_s=0)
    w = writer(loc, rate_limiter=lim)
    w.add_trajectories([make_traj(k) for k in range(4)])  # no learner declared: no wait
    w.flush()
    view = zreplay.open(loc[0], rate_limiter=lim, learner_id="L")
    # joined with 72 rows stored: the 54 beyond min_size_to_sample are not owed samples,
    # so diff starts at the centre (18) and the writer may add 36 more rows
    w.add_trajectories([make_traj(4), make_traj(5)])
    with pytest.raises(RateLimitTimeout, match="ahead of learner 'L'"):
        w.add_trajectories([make_traj(6)])
    assert len(w) == 6  # nothing was added by the call that timed out
    view.refresh()
    view.sample(36)  # the learner catches up (published at once: publish_every_s=0)
    w.add_trajectories([make_traj(6)])
    view.close()  # a learner that stopped holds nobody back
    w.add_trajectories([make_traj(k) for k in range(7, 12)])
    w.close()


def test_a_silent_learner_is_ignored_after_learner_timeout_s(loc):
    empty_buffer(loc)
    lim = SampleToInsertRatio(1.0, ROWS, error_buffer=ROWS, timeout_s=5, learner_timeout_s=0.5)
    # declares itself, never samples (kept alive: a view that is dropped says it stopped)
    silent = zreplay.open(loc[0], rate_limiter=lim, learner_id="gone")
    w = writer(loc, rate_limiter=lim)
    t0 = time.monotonic()
    w.add_trajectories([make_traj(k) for k in range(3)])
    w.add_trajectories([make_traj(3)])  # ahead of 'gone': waits until it counts as gone
    assert 0.4 <= time.monotonic() - t0 < 4
    w.close()
    del silent


def test_one_buffer_that_writes_and_learns(loc):
    """A TrajectoryReplayBuffer with learner_id keeps pace with itself (Reverb in-process)."""
    lim = SampleToInsertRatio(1.0, ROWS, error_buffer=ROWS, timeout_s=0.2, publish_every_s=0)
    w = writer(loc, rate_limiter=lim, learner_id="self", sample_window_size=0)
    with pytest.raises(RateLimitTimeout, match="fewer than"):
        w.sample(1)
    w.add_trajectories([make_traj(0), make_traj(1)])  # diff 36: at most 36 + 18 - 0 ahead
    w.sample(36)
    with pytest.raises(RateLimitTimeout, match="learner 'self'"):
        w.sample(19)
    w.add_trajectories([make_traj(2)])
    w.sample(19)
    w.close()


def test_learner_progress_files_live_in_the_zreplay_node(loc):
    lim = SampleToInsertRatio(1.5, 10, error_buffer=100)
    w = writer(loc)
    w.add_trajectories([make_traj(0)])
    w.flush()
    view = zreplay.open(loc[0], rate_limiter=lim, learner_id="learner-0")
    view.sample(20)
    view.close()
    f = f"{loc[0]}/zreplay/learners/learner-0.json"
    got = json.load(open(f))
    assert got["samples"] == 20 and got["closed"] is True
    assert got["limits"] == {
        "samples_per_insert": 1.5,
        "min_size_to_sample": 10,
        "min_diff": 15 - 100,
        "max_diff": 15 + 100,
    }
    # plain zarr walks the buffer without a warning (warnings are errors in the tests)
    zarr.open_group(loc[0], mode="r").members(max_depth=None)
    w.close()


# -- real processes, local disk and S3 ------------------------------------------------

LIMITS = dict(samples_per_insert=1.0, min_size_to_sample=2 * ROWS, error_buffer=5 * ROWS)
MIN_DIFF, MAX_DIFF = 36 - 90, 36 + 90


def small_traj(tid: int) -> dict:
    """Two keys only (fewer requests on S3): rewards encode (trajectory, env, step)."""
    code = tid * 10000 + np.arange(3)[None, :] * 100 + np.arange(6)[:, None]
    return {"obs": np.zeros((6, 3, 2), np.float32), "rewards": code.astype(np.float32)}


def _learner(path, opts, batches, pause):
    lim = SampleToInsertRatio(**LIMITS, timeout_s=60, publish_every_s=0)
    view = zreplay.open(path, storage_options=opts, rate_limiter=lim, learner_id="L")
    seen, t0 = [], time.monotonic()
    for i in range(batches):
        view.sample(32)
        if i == 0:
            first_wait = time.monotonic() - t0
        view.refresh()
        seen.append(
            (view.core.rate.me.samples, sum(c.n_rows for _, c in view.core.engine.segments()))
        )
        time.sleep(pause)
    view.close()
    return first_wait, seen


def _writer(path, opts, wid, first):
    lim = SampleToInsertRatio(**LIMITS, timeout_s=60)
    root = zreplay.open(path, storage_options=opts).root.path
    deadline = time.monotonic() + 60
    while read_progress(root, "L") is None:
        assert time.monotonic() < deadline, "the learner never declared itself"
        time.sleep(0.05)
    time.sleep(0.3)  # the learner is waiting for rows now
    buf = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=path, storage_options=opts, writer_id=wid, rate_limiter=lim
    )
    added = 0
    while added < 60 and not read_progress(root, "L").closed:
        buf.add_trajectories([small_traj(first + added)])
        buf.flush()
        added += 1
    buf.close()
    return added


def test_writers_and_a_learner_in_separate_processes_keep_the_ratio(shared_location):
    path, opts = shared_location
    empty_buffer(shared_location)
    batches = 4 if opts else 6  # moto answers slowly: fewer rounds on S3
    (first_wait, seen), added0, added1 = run_children(
        [
            (_learner, (path, opts, batches, 0.3)),
            (_writer, (path, opts, "w0", 0)),
            (_writer, (path, opts, "w1", 1000)),
        ],
        timeout=240,
    )
    assert first_wait >= 0.2  # it waited for min_size_to_sample rows from the writers
    ahead = [inserted - samples for samples, inserted in seen]
    # the learner never ran more than -min_diff samples ahead of the inserts ...
    assert min(ahead) >= MIN_DIFF
    # ... and the writers never more than max_diff rows ahead of its published count
    # (plus one add each that may be in flight when the learner looks), but they did
    # reach that bound: they were held back, not merely slow
    assert max(ahead) <= MAX_DIFF + 2 * ROWS, seen
    assert max(ahead) >= MAX_DIFF - 2 * ROWS, seen
    view = zreplay.open(path, storage_options=opts)
    assert view.num_rows == (added0 + added1) * ROWS
    samples = seen[-1][0]
    assert samples == batches * 32

    # the learner restarts (same learner_id): its count resumes from its progress file
    lim = SampleToInsertRatio(**LIMITS, timeout_s=0.5, publish_every_s=0)
    again = zreplay.open(path, storage_options=opts, rate_limiter=lim, learner_id="L")
    assert again.core.rate.me.samples == samples
    again.sample(view.num_rows - samples - MIN_DIFF)  # exactly up to the bound ...
    with pytest.raises(RateLimitTimeout):
        again.sample(1)  # ... and no further
    again.close()


def test_a_call_larger_than_the_error_buffer_goes_through_at_the_target(loc):
    lim = SampleToInsertRatio(1.0, ROWS, error_buffer=10, timeout_s=0.2)
    w = writer(loc, sample_window_size=0)
    view = zreplay.open(loc[0], rate_limiter=lim, learner_id="L")
    w.add_trajectories([make_traj(0), make_traj(1)])
    w.flush()
    view.sample(36 - 18)  # diff 36 - 18 = 18: at the target (18 * 1)
    view.sample(40)  # 40 > error buffer, but the learner was not ahead: let through once
    with pytest.raises(RateLimitTimeout) as e:
        view.sample(1)  # now 22 samples ahead: waits for inserts
    assert isinstance(e.value, TimeoutError)
    w.close()


def test_one_thread_adding_and_sampling_does_not_wait_for_its_own_publish(loc):
    """The writer reads this process's learner counts as they are, not as last
    published (every 0.5 s by default)."""
    lim = SampleToInsertRatio(2.0, 2 * ROWS, error_buffer=2 * ROWS, timeout_s=1)
    actor = writer(loc, rate_limiter=lim)
    actor.add_trajectories([make_traj(0), make_traj(1)])
    actor.flush()
    learner = zreplay.open(loc[0], rate_limiter=lim, learner_id="L")
    for k in range(2, 12):
        actor.add_trajectories([make_traj(k)])  # 18 rows: 36 samples owed
        actor.flush()
        learner.sample(36)
    learner.close()
    actor.close()


def test_a_clear_counts_no_inserts(loc):
    """clear() moves the row numbers on to a shard boundary (65536 rows here); counted as
    inserts, the learner was owed tens of thousands of samples from a few hundred rows
    and the writer, far 'ahead', waited forever."""
    lim = SampleToInsertRatio(1.0, ROWS, error_buffer=2 * ROWS, timeout_s=0.3, publish_every_s=0)
    w = writer(loc, rate_limiter=lim, sample_window_size=0)
    w.add_trajectories([make_traj(0), make_traj(1)])
    w.flush()
    learner = zreplay.open(loc[0], rate_limiter=lim, learner_id="L")
    learner.sample(36)
    w.clear()
    w.add_trajectories([make_traj(2), make_traj(3)])  # within bounds: no wait
    w.flush()
    assert w.core.engine.commit.n_rows > 65536  # the row numbers did jump
    learner.refresh()
    assert sum(c.inserted for _, c in learner.core.engine.commits()) == 4 * ROWS
    learner.sample(36 + 2 * ROWS)  # what 72 inserts allow (plus the error buffer) ...
    with pytest.raises(RateLimitTimeout):
        learner.sample(1)  # ... and not a sample more
    learner.close()
    w.close()


# -- waits end when their owner closes ----------------------------------------------------


def test_leaving_a_prefetch_block_ends_a_rate_limited_wait_at_once(loc):
    """The prefetch thread waits for rows that never come (no timeout); leaving the
    block took 30 s and leaked the thread."""
    lim = MinSize(10 * ROWS)  # timeout_s=None: waits forever
    w = writer(loc, rate_limiter=lim, learner_id="L", sample_window_size=0)
    w.add_trajectories([make_traj(0)])
    w.flush()
    with w.prefetch(8) as batches:
        time.sleep(0.3)  # the thread is waiting in the limiter now
        thread = batches._thread
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 2.0
    thread.join(2.0)
    assert not thread.is_alive()
    w.close()


def _closing_ends_the_wait(wait, close, within: float) -> None:
    """``wait()`` blocks on another thread; ``close()`` ends it with BufferClosedError
    within ``within`` seconds."""
    got = []

    def waiter():
        try:
            got.append(wait())
        except BaseException as e:  # noqa: BLE001 - inspected below
            got.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    close()
    t.join(within)
    assert not t.is_alive() and time.monotonic() - t0 < within
    assert isinstance(got[0], zreplay.BufferClosedError), got


def test_closing_a_buffer_ends_a_wait_of_another_thread(loc):
    empty_buffer(loc)
    view = zreplay.open(loc[0], rate_limiter=MinSize(ROWS))  # waits forever: no rows
    _closing_ends_the_wait(lambda: view.sample(4), view.close, within=2.0)


def test_closing_a_dataset_iterator_ends_its_wait_for_rows(loc):
    """ReplayDataset polls until its buffer holds min_size; a closed iterator's
    prefetch thread slept out its poll_s (and leaked past close's 30 s join)."""
    w = writer(loc, sample_window_size=0)
    w.add_trajectories([make_traj(0)])
    w.flush()
    ds = zreplay.ReplayDataset(w, batch_size=4, min_size=1, poll_s=60.0)
    it = iter(ds)
    next(it)
    w.clear()  # the next batches wait for a trajectory that never comes
    time.sleep(0.3)
    threads = [t for t in threading.enumerate() if t.name == "zreplay-prefetch"]
    assert threads
    t0 = time.monotonic()
    it.close()  # what dropping the iterator does
    for t in threads:
        t.join(2.0)
    assert time.monotonic() - t0 < 2.0
    assert not any(t.is_alive() for t in threads)
    w.close()


def test_a_clip_draw_that_failed_is_not_counted(loc):
    lim = SampleToInsertRatio(1.0, ROWS, error_buffer=ROWS, timeout_s=0.3, publish_every_s=0)
    w = writer(loc, sample_window_size=0)
    w.add_trajectories([make_traj(0), make_traj(1)])
    w.flush()
    view = zreplay.open(loc[0], rate_limiter=lim, learner_id="L")
    w.clear()
    w.add_trajectories([make_traj(2)])  # 18 rows, but episodes too short for clips of 8
    w.flush()
    view.refresh()
    with pytest.raises((EmptyBufferError, ValueError)):
        view.sample_clips(8, history_len=8)
    assert view.core.rate.me.samples == 0  # nothing was drawn, nothing is owed
    assert view.sample_clips(4, history_len=2)["actions"].shape[:2] == (4, 2)
    assert view.core.rate.me.samples == 4  # counted once read
    view.close()
    w.close()


def test_a_learner_starts_over_on_a_buffer_made_again_at_its_path(loc):
    """overwrite=True made another buffer at the path; a live learner carried its old
    count into it (blocked at once, while writers ran far ahead of it)."""
    lim = SampleToInsertRatio(1.0, ROWS, error_buffer=ROWS, timeout_s=0.3, publish_every_s=0)
    w = writer(loc, sample_window_size=0)
    w.add_trajectories([make_traj(k) for k in range(4)])
    w.close()
    view = zreplay.open(loc[0], rate_limiter=lim, learner_id="L")
    view.sample(72)
    w = writer(loc, sample_window_size=0, overwrite=True)
    w.add_trajectories([make_traj(10), make_traj(11)])
    w.flush()
    view.refresh()
    view.sample(36)  # a learner new to this buffer: 36 inserted rows allow this much
    assert view.core.rate.me.samples == 36
    view.close()
    w.close()


def test_a_dataset_waiting_for_rows_ends_when_its_buffer_is_closed(loc):
    w = writer(loc, sample_window_size=0)
    ds = zreplay.ReplayDataset(w, batch_size=4, min_size=5, poll_s=60.0)
    _closing_ends_the_wait(lambda: next(iter(ds)), w.close, within=5.0)


def test_an_episode_buffer_given_a_learner_id_is_writer_and_learner(tmp_path):
    """ReplayBuffer takes the store options TrajectoryReplayBuffer does: with both a
    rate limiter and a learner id its samples wait as a learner's, and give up."""
    limiter = zreplay.SampleToInsertRatio(
        samples_per_insert=1.0, min_size_to_sample=1, error_buffer=20, timeout_s=0.3
    )
    rb = zreplay.ReplayBuffer(1000, path=str(tmp_path / "b"), rate_limiter=limiter, learner_id="L")
    rb.write_episode({"obs": np.zeros((20, 2), np.float32), "action": np.zeros((20, 1))})
    rb.flush()
    rb.sample(10)  # within bounds
    with pytest.raises(zreplay.RateLimitTimeout):
        for _ in range(20):
            rb.sample(10)
    rb.close()
