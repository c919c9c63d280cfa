"""Threads adding while others sample; a writer killed with SIGKILL; a second writer process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from conftest import check_rows, make_traj, traj_equal

import zreplay
from zreplay import WriterLockedError


@pytest.mark.parametrize("enable_cache", [True, False])
def test_sample_while_adding_never_tears_rows(bufpath, enable_cache):
    buf = zreplay.TrajectoryReplayBuffer(
        seed=0,
        auto_save=True,
        auto_save_path=bufpath,
        enable_cache=enable_cache,
        cache_size=2,  # the RAM ring wraps constantly: slots are reused under the samplers
        sample_window_size=0,
        capacity=30 * 18,  # eviction runs too
    )
    buf.add_trajectories([make_traj(0)])
    stop = threading.Event()
    errors: list[BaseException] = []
    seen: set[int] = set()

    def sampler():
        try:
            while not stop.is_set():
                seen.update((check_rows(buf.sample(128)) // 10000).tolist())
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=sampler) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(1, 120):
            buf.add_trajectories([make_traj(i)])
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[0]
    assert len(seen) > 10
    buf.flush()
    assert len(buf) == 30
    check_rows(buf.sample(2000))
    buf.close()


WRITER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from conftest import make_traj
    import zreplay
    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path={path!r}, cache_size=3)
    start = len(buf)
    i = start
    while True:
        buf.add_trajectories([make_traj(i, T=4 + i % 5, B=3)])
        if i % 3 == 0:
            buf.flush()
            print(i, flush=True)
        i += 1
    """
)


def test_kill_9_loses_nothing_committed_and_exposes_nothing_torn(bufpath):
    tests_dir = os.path.dirname(__file__)
    rng = np.random.default_rng(0)
    flushed = -1
    for trial in range(8):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER.format(tests=tests_dir, path=bufpath)],
            stdout=subprocess.PIPE,
            text=True,
        )
        # Wait for at least one flushed commit, then kill at a random moment.
        line = proc.stdout.readline()
        assert line, f"writer died in trial {trial}"
        time.sleep(rng.uniform(0, 0.4))
        os.kill(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate()
        printed = [int(x) for x in (line + rest).split()]
        flushed = max(flushed, max(printed))

        view = zreplay.open(bufpath)
        n = view.num_trajectories
        assert n >= flushed + 1, f"trial {trial}: flushed {flushed + 1}, visible {n}"
        for i in sorted({0, flushed, n - 1, int(rng.integers(n))}):
            got = view.trajectory(i)
            assert got["trajectory_id"] == i
            traj_equal(got, make_traj(i, T=4 + i % 5, B=3))
        check_rows(view.sample(500))
    # The dead writer's lock is stale: a new writer takes over and keeps going.
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=bufpath) as buf:
        n = len(buf)
        assert buf.add_trajectories([make_traj(n, T=4 + n % 5, B=3)]) == [n]
    # The killed writers' temp files were cleaned; the new writer left none.
    leftovers = [
        f
        for r, _, fs in os.walk(bufpath)
        for f in fs
        if f.endswith((".partial", ".tmp", ".__lock"))
    ]
    assert leftovers == []


HOLDER = textwrap.dedent(
    """
    import sys, time
    import zreplay
    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path={path!r})
    print("locked", flush=True)
    time.sleep(60)
    """
)


def test_second_writer_in_another_process_fails_fast(bufpath):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(path=bufpath)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(WriterLockedError, match=f"pid {proc.pid}"):
            zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=bufpath)
    finally:
        proc.kill()
        proc.wait()
    zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=bufpath).close()


def test_orphan_cleanup_skips_only_fully_committed_shards(tmp_path):
    from zreplay.store.commit import remove_orphans

    seg = tmp_path / "seg"
    files = {
        "data/img/c/0/0/0.__lock": True,  # shard 0 holds only committed rows: not searched
        "data/img/c/1/0/0.__lock": False,  # the partial shard a killed writer was rewriting
        "data/img/c/7.partial": False,
        "offsets/c/0.__lock": False,
        "zarr.json.abc.partial": False,
        "commit.json.123.456.tmp": False,
        "commit.json": True,
    }
    for rel in files:
        (seg / rel).parent.mkdir(parents=True, exist_ok=True)
        (seg / rel).write_text("x")
    remove_orphans(seg, {str(seg / "data" / "img" / "c"): 1})
    assert {rel: (seg / rel).exists() for rel in files} == files
