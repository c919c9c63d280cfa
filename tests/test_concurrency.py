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
from conftest import check_rows, make_traj, processes

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


# -- kill -9 at random moments -------------------------------------------------------------
# Each trial starts a writer process on one of a few buffers, kills it with SIGKILL (from
# outside at a random moment, or from inside at a chosen step of a commit, an eviction or
# a shard growth), then checks what a reader sees.  Trajectory ``s`` of a buffer is
# make_traj(s, T=traj_T(s), B=3): every value encodes (s, env, step), so the visible rows
# can be checked bit for bit against what must be there, whatever id the buffer gave them.

SMALL_SHARDS = {"chunk_rows": 16, "shard_rows": 64}
CRASH_BUFFERS = {
    # RAM tier of 3 trajectories: adds keep waiting for commits (backpressure).
    "plain": {"cache_size": 3},
    # Evicts on every add; 64-row shards below the low-water mark are deleted constantly.
    "evict": {"cache_size": 3, "capacity": 600, "layout": "small"},
    # 32-row shards on a growing buffer: capacity grows (zarr.json rewrites) often.
    "grow": {"cache_size": 3, "layout": {"chunk_rows": 16, "shard_rows": 32}},
}
CRASH_PLAN = {  # buffer -> {how the writer dies: trials}
    "plain": {"open": 3, "random": 12, "commit_before": 3, "commit_rename": 3, "commit_after": 3},
    "evict": {"open": 2, "random": 8, "reclaim": 6, "commit_rename": 2},
    "grow": {"random": 2, "grow": 8},
}
KEYS = [
    "actions", "intervene_flags", "rewards", "terminations", "truncations", "dones",
    "prev_logprobs", "versions", "curr_obs/main_images", "curr_obs/states",
    "next_obs/main_images", "next_obs/states",
]  # fmt: skip


def traj_T(s: int) -> int:
    return 4 + s % 5


def traj_codes(s: int, B: int = 3) -> np.ndarray:
    """The codes of trajectory ``s``'s rows in stored (env-major) order."""
    T = traj_T(s)
    return s * 10000 + (np.arange(B)[:, None] * 100 + np.arange(T)[None, :]).ravel()


def _buffer_kwargs(cfg: dict) -> dict:
    kw = dict(cfg)
    lay = kw.pop("layout", None)
    if lay is not None:
        lay = SMALL_SHARDS if lay == "small" else lay
        kw["layout"] = {k: lay for k in KEYS}
    return kw


def _die(conn, what: str) -> None:
    conn.send(("hook", what))
    os.kill(os.getpid(), signal.SIGKILL)


def _arm(mode: str, rng, conn) -> None:
    """Make this process SIGKILL itself at the chosen step (fault injection, child only)."""
    from zreplay.engine import committer
    from zreplay.store import segment

    if mode.startswith("commit_"):
        nth, calls = int(rng.integers(1, 4)), [0]
        write = committer.write_commit

        def write_commit(seg_dir, commit, durable=True):
            calls[0] += 1
            if calls[0] != nth:
                return write(seg_dir, commit, durable)
            if mode == "commit_before":  # every data chunk and index entry written
                _die(conn, mode)
            if mode == "commit_rename":  # the new record fully in its temp file
                replace = os.replace

                def dying_replace(src, dst, *a, **kw):
                    if str(dst).endswith("commit.json"):
                        _die(conn, mode)
                    return replace(src, dst, *a, **kw)

                os.replace = dying_replace
            write(seg_dir, commit, durable)
            _die(conn, mode)  # commit_after: published, but flush() has not returned

        committer.write_commit = write_commit
    elif mode == "reclaim":
        reclaim = segment.Segment.reclaim_below

        def reclaim_below(self, start, stop):  # the reclaim was announced in commit.json
            reclaim(self, start, start + int(rng.integers(0, stop - start + 1)))
            _die(conn, mode)

        segment.Segment.reclaim_below = reclaim_below
    elif mode == "grow":
        nth, after, grown = int(rng.integers(1, len(KEYS) + 1)), bool(rng.integers(2)), [0]
        grow = segment.ArrayHandle.grow_to

        def grow_to(self, rows_needed, unit):
            if rows_needed <= self.rows:
                return grow(self, rows_needed, unit)
            grown[0] += 1
            if grown[0] == nth and not after:
                _die(conn, mode)  # some arrays already have the larger shape, others not
            grow(self, rows_needed, unit)
            if grown[0] == nth:
                _die(conn, mode)

        segment.ArrayHandle.grow_to = grow_to


def _crash_writer(path: str, conn, mode: str, seed: int, cfg: dict) -> None:
    """Append and flush in a loop until killed; report each flush after it returned."""
    conn.send(("ready",))
    rng = np.random.default_rng(seed)
    buf = zreplay.TrajectoryReplayBuffer(
        seed=0, auto_save=True, auto_save_path=path, **_buffer_kwargs(cfg)
    )
    view = zreplay.open(path)
    s = int(view.trajectory(-1)["versions"].flat[0]) + 1 if view.num_trajectories else 0
    _arm(mode, rng, conn)
    conn.send(("open", s))
    while True:
        for _ in range(int(rng.integers(1, 4))):
            conn.send(("adding", s))
            buf.add_trajectories([make_traj(s, T=traj_T(s), B=3)])
            s += 1
        buf.flush()
        conn.send(("flushed", s - 1))


def _run_until_killed(ctx, path, mode, seed, cfg, rng) -> list:
    """One trial: start a writer, kill it (or let it kill itself), return its messages."""
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_crash_writer, args=(path, send, mode, seed, cfg))
    proc.start()
    send.close()
    trigger = {"open": "ready", "random": "open"}.get(mode)
    delay = rng.uniform(0, 0.05 if mode == "open" else 0.3)
    kill_at, msgs = None, []
    deadline = time.monotonic() + 30
    while True:
        while recv.poll(0.005):
            try:
                msgs.append(recv.recv())
            except EOFError:
                break
            if trigger and msgs[-1][0] == trigger:
                kill_at = time.monotonic() + delay
        if proc.exitcode is not None:
            while recv.poll(0):
                try:
                    msgs.append(recv.recv())
                except EOFError:
                    break
            break
        if kill_at is not None and time.monotonic() >= kill_at:
            os.kill(proc.pid, signal.SIGKILL)
            kill_at = None
        assert time.monotonic() < deadline, f"{mode}: the writer never died; {msgs[-3:]}"
    proc.join()
    assert proc.exitcode == -signal.SIGKILL, f"{mode}: exit code {proc.exitcode}"
    if trigger is None:
        assert ("hook", mode) in msgs, f"{mode}: the fault was never reached"
    return msgs


def check_visible(path: str, flushed: int, capacity: int | None, added: int) -> int:
    """Every visible row is bit-exact, trajectories are whole and consecutive, every one
    whose flush() returned is there, and eviction removed only what capacity demands once
    trajectories up to ``added`` were added (eviction happens at add time, so a trajectory
    added but lost in the crash may have evicted committed ones)."""
    view = zreplay.open(path)
    if view.num_rows == 0:
        assert flushed < 0
        return -1
    rows = view.rows(np.arange(view.num_rows))
    codes = check_rows(rows)
    assert not rows["intervene_flags"].any()
    first, last = int(codes[0] // 10000), int(codes[-1] // 10000)
    want = np.concatenate([traj_codes(s) for s in range(first, last + 1)])
    np.testing.assert_array_equal(codes, want)  # nothing torn, duplicated or missing
    assert view.num_trajectories == last - first + 1
    assert last >= flushed, f"trajectory {flushed} was flushed, only {last} is visible"
    if capacity is None:
        assert first == 0
    else:
        assert len(codes) <= capacity
        assert first == 0 or sum(len(traj_codes(t)) for t in range(first - 1, added + 1)) > capacity
    return last


def test_kill_9_loses_nothing_committed_and_exposes_nothing_torn(tmp_path):
    rng = np.random.default_rng(0)
    plan = [(b, m) for b, modes in CRASH_PLAN.items() for m, n in modes.items() for _ in range(n)]
    assert len(plan) >= 50
    rng.shuffle(plan)
    ctx = processes()
    flushed, added = dict.fromkeys(CRASH_BUFFERS, -1), dict.fromkeys(CRASH_BUFFERS, -1)
    for trial, (name, mode) in enumerate(plan):
        path, cfg = str(tmp_path / name), CRASH_BUFFERS[name]
        msgs = _run_until_killed(ctx, path, mode, trial, cfg, rng)
        done = [m[1] for m in msgs if m[0] == "flushed"]
        flushed[name] = max([flushed[name], *done])
        added[name] = max([added[name], *(m[1] for m in msgs if m[0] == "adding")])
        try:
            check_visible(path, flushed[name], cfg.get("capacity"), added[name])
        except AssertionError as e:
            raise AssertionError(f"trial {trial} ({name}, killed at {mode}): {e}") from e
    for name, cfg in CRASH_BUFFERS.items():
        path = str(tmp_path / name)
        assert zreplay.verify(path).ok, str(zreplay.verify(path))
        # The last writer's lock is stale: a new writer takes over and keeps going.
        with zreplay.TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=path, **_buffer_kwargs(cfg)
        ) as buf:
            s = check_visible(path, flushed[name], cfg.get("capacity"), added[name]) + 1
            buf.add_trajectories([make_traj(s, T=traj_T(s), B=3)])
        assert check_visible(path, s, cfg.get("capacity"), s) == s
        # The killed writers' temp files were cleaned up; the clean close left none.
        leftovers = [
            f
            for r, _, fs in os.walk(path)
            for f in fs
            if f.endswith((".partial", ".tmp", ".__lock")) or f == "writer.lock"
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
