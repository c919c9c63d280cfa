"""Threads adding while others sample; a writer killed with SIGKILL; a second writer process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import zlib

import builders
import numpy as np
import pytest
import zarr
from conftest import check_rows, make_traj, processes, run_children, shard_files

import zreplay
from zreplay import WriterLockedError
from zreplay.store.commit import read_commit


@pytest.mark.parametrize("enable_cache", [True, False])
def test_sample_while_adding_never_tears_rows(bufpath, enable_cache):
    buf = builders.writer(
        bufpath,
        # the RAM ring of 2 wraps constantly: slots are reused under the samplers
        ram_trajectories=2 if enable_cache else 0,
        capacity=30 * 18,  # eviction runs too
    )
    builders.add_full(buf, [0])
    stop = threading.Event()
    errors: list[BaseException] = []
    seen: set[int] = set()

    def sampler():
        try:
            while not stop.is_set():
                seen.update((check_rows(builders.nested(buf.sample(128))) // 10000).tolist())
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=sampler) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(1, 120):
            builders.add_full(buf, [i])
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[0]
    assert len(seen) > 10
    buf.flush()
    assert buf.num_trajectories == 30
    check_rows(builders.nested(buf.sample(2000)))
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
    # 32-row shards on a growing buffer (every commit rewrites each array's zarr.json).
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
        start = segment.ArrayHandle.start_resize

        def start_resize(self, rows):  # every commit grows its arrays first
            if rows <= self.rows:
                return start(self, rows)
            grown[0] += 1
            if grown[0] == nth and not after:
                _die(conn, mode)  # some arrays already have the larger shape, others not
            pending = start(self, rows)
            if grown[0] == nth:
                pending.result()
                _die(conn, mode)
            return pending

        segment.ArrayHandle.start_resize = start_resize


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


@pytest.mark.slow  # a multi-process soak: python -m pytest -m slow
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
        # Trajectories a killed writer added (and lost) may have evicted committed ones.
        assert check_visible(path, s, cfg.get("capacity"), max(s, added[name])) == s
        # Plain zarr shows the committed rows only, whatever length a killed commit left.
        commit, seg = read_commit(f"{path}/segments/default"), zarr.open_group(path, mode="r")
        for key in KEYS:
            assert seg[f"segments/default/data/{key}"].shape[0] == commit.n_rows, key
        assert seg["segments/default"].attrs["live_rows"] == [
            commit.low_row,
            commit.n_rows,
        ]
        if cfg.get("capacity"):  # writers killed while deleting evicted shards leaked none
            below = read_commit(f"{path}/segments/default").reclaimed_below // 64
            assert below > 0
            for key in KEYS:
                shards = [int(p.name.split(".")[1]) for p in shard_files(path, key)]
                assert shards and min(shards) >= below, key
        # The killed writers' temp files were cleaned up; the clean close left none.
        leftovers = [
            f
            for r, _, fs in os.walk(path)
            for f in fs
            if f.endswith((".partial", ".tmp", ".__lock")) or f == "writer.lock"
        ]
        assert leftovers == []


# -- soak: 4 writer processes and 2 reader processes on one directory --------------------
# Row (w, s, r) of writer w's trajectory s carries ident = (w, s, r), obs (random) and
# check = crc32 of ident and obs: a reader can verify any row it gets on its own.

SOAK_SECONDS = 8.0
SOAK_MIN_TRAJ = 12
# Writer 3 evicts: its oldest trajectories leave, and its 64-row shards are deleted under
# the readers' feet (they must retry, never return the zeros of a deleted shard).  Every
# writer of a buffer uses one layout (the first to fix the schema records it).
SOAK_CAPACITY = 400
SOAK_LAYOUT = {k: {"chunk_rows": 16, "shard_rows": 64} for k in ("ident", "obs", "check")}
SOAK_KW = [{"layout": SOAK_LAYOUT}] * 3 + [{"capacity": SOAK_CAPACITY, "layout": SOAK_LAYOUT}]


def soak_traj(w: int, s: int) -> dict:
    rng = np.random.default_rng([w, s])
    T, B = int(rng.integers(2, 9)), int(rng.integers(1, 5))
    n = T * B
    ident = np.stack([np.full(n, w), np.full(n, s), np.arange(n)], 1).astype(np.int64)
    obs = rng.standard_normal((n, 16)).astype(np.float32)
    check = row_checks(ident, obs)
    # [T, B, ...] with rows of the stored env-major order numbered 0..n-1
    return {
        k: np.ascontiguousarray(v.reshape(B, T, *v.shape[1:]).swapaxes(0, 1))
        for k, v in {"ident": ident, "obs": obs, "check": check}.items()
    }


def row_checks(ident: np.ndarray, obs: np.ndarray) -> np.ndarray:
    return np.array(
        [[zlib.crc32(i.tobytes() + o.tobytes())] for i, o in zip(ident, obs, strict=True)],
        np.uint32,
    )


def _soak_writer(path: str, w: int, seconds: float) -> dict:
    rng = np.random.default_rng(100 + w)
    buf = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=path, writer_id=f"w{w}", cache_size=4, **SOAK_KW[w]
    )
    s = rows = 0
    deadline = time.monotonic() + seconds
    # Work (not time) decides when to stop, so a loaded machine slows the test down but
    # never fails it: at least SOAK_MIN_TRAJ trajectories, for at least ``seconds``.
    while time.monotonic() < deadline or s < SOAK_MIN_TRAJ:
        for _ in range(int(rng.integers(1, 4))):
            t = soak_traj(w, s)
            buf.add_trajectories([t])
            s, rows = s + 1, rows + t["check"].size
        if rng.random() < 0.5:
            buf.flush()
        time.sleep(float(rng.uniform(0, 0.02)))
    buf.close()  # commits the rest
    return {"writer_id": f"w{w}", "trajectories": s, "rows": rows}


def _soak_reader(path: str, seed: int, seconds: float) -> dict:
    rng = np.random.default_rng(seed)
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        time.sleep(0.01)
    while True:  # the writers are creating the buffer
        try:
            view = zreplay.open(path, seed=seed)
            break
        except zreplay.FormatError:
            time.sleep(0.01)
    rows_checked = samples = refreshes = trajs_read = 0
    seen: dict[int, int] = {}  # writer -> highest trajectory seen
    last_rows = 0

    def enough() -> bool:
        return samples > 5 and refreshes > 2 and trajs_read > 0 and len(seen) == 4

    give_up = deadline + 120  # a reader that never sees enough fails the test's asserts
    while time.monotonic() < deadline or (not enough() and time.monotonic() < give_up):
        refreshes += view.refresh()
        # Only the evicting writer's segment may shrink, and it holds <= its capacity.
        assert view.num_rows >= last_rows - SOAK_CAPACITY, "a refresh lost rows"
        last_rows = view.num_rows
        if not view.num_rows:
            continue
        batch = view.sample(256)
        ident, obs, check = batch["ident"], batch["obs"], batch["check"]
        np.testing.assert_array_equal(row_checks(ident, obs), check)
        rows_checked += len(check)
        samples += 1
        for w, s in zip(ident[:, 0], ident[:, 1], strict=True):
            seen[int(w)] = max(seen.get(int(w), -1), int(s))
        if rng.random() < 0.3:  # a whole trajectory: all its rows, in order, all valid
            t = view.trajectory(int(rng.integers(view.num_trajectories)))
            w, s = (int(x) for x in t["ident"][0, 0, :2])
            want = soak_traj(w, s)
            for k in want:
                np.testing.assert_array_equal(t[k], want[k])
            trajs_read += 1
    return {
        "rows_checked": rows_checked,
        "samples": samples,
        "refreshes": refreshes,
        "trajectories_read": trajs_read,
        "seen": seen,
    }


@pytest.mark.slow  # a multi-process soak: python -m pytest -m slow
def test_four_writer_and_two_reader_processes_agree(tmp_path):
    path = str(tmp_path / "soak")
    writers = [(_soak_writer, (path, w, SOAK_SECONDS)) for w in range(4)]
    readers = [(_soak_reader, (path, 7 + r, SOAK_SECONDS)) for r in range(2)]
    results = run_children(writers + readers, timeout=SOAK_SECONDS + 240)
    wrote, read = results[:4], results[4:]
    # What each segment must hold: everything its writer added (all flushed by close()),
    # less what capacity evicted (the oldest trajectories while over capacity).
    want = []
    for w, r in enumerate(wrote):
        assert r["trajectories"] > 10, r
        mine = [soak_traj(w, s)["ident"].swapaxes(0, 1).reshape(-1, 3)
                for s in range(r["trajectories"])]  # fmt: skip
        if "capacity" in SOAK_KW[w]:
            while sum(map(len, mine)) > SOAK_CAPACITY:
                mine.pop(0)
        else:
            assert sum(map(len, mine)) == r["rows"]
        want.append(np.concatenate(mine))
    view = zreplay.open(path)
    assert view.writer_ids == [f"w{w}" for w in range(4)]
    assert view.num_rows == sum(map(len, want))
    every = view.rows(np.arange(view.num_rows))
    np.testing.assert_array_equal(row_checks(every["ident"], every["obs"]), every["check"])
    np.testing.assert_array_equal(every["ident"], np.concatenate(want))  # segment by segment
    assert view.num_trajectories == len(np.unique(every["ident"][:, :2], axis=0))
    for r in read:
        assert r["samples"] > 5 and r["trajectories_read"] > 0, r
        assert r["refreshes"] > 2, r  # saw commits arrive while it ran
        assert sorted(r["seen"]) == [0, 1, 2, 3], r
        for w, s in r["seen"].items():
            assert s < wrote[w]["trajectories"]
    assert zreplay.verify(path).ok


HOLDER = textwrap.dedent(
    """
    import sys, time; sys.path.insert(0, {tests!r})
    import builders
    buf = builders.writer({path!r})
    print("locked", flush=True)
    time.sleep(60)
    """
)


def test_second_writer_in_another_process_fails_fast(bufpath):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(tests=os.path.dirname(__file__), path=bufpath)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(WriterLockedError, match=f"pid {proc.pid}"):
            builders.writer(bufpath)
    finally:
        proc.kill()
        proc.wait()
    builders.writer(bufpath).close()


def test_orphan_cleanup_skips_only_fully_committed_shards(tmp_path):
    from zreplay.store.commit import remove_orphans

    seg = tmp_path / "seg"
    files = {
        "data/img/c/0/0/0.__lock": True,  # shard 0 holds only committed rows: not searched
        "data/img/c/1/0/0.__lock": False,  # the partial shard a killed writer was rewriting
        "data/img/c/7.partial": False,
        # format 5: shard files side by side in the array's directory
        "data/flat/c.0.0.0.__lock": True,  # shard 0: not searched
        "data/flat/c.1.0.0.__lock": False,
        "data/flat/c.1.0.0.77.0a1b2c3d4e5f.tmp": False,
        "data/flat/zarr.json.abc.partial": False,
        "offsets/c/0.__lock": False,
        "zarr.json.abc.partial": False,
        "commit.json.123.456.tmp": False,
        "commit.json": True,
    }
    for rel in files:
        (seg / rel).parent.mkdir(parents=True, exist_ok=True)
        (seg / rel).write_text("x")
    remove_orphans(seg, {str(seg / "data" / "img" / "c"): 1, str(seg / "data" / "flat"): 1})
    assert {rel: (seg / rel).exists() for rel in files} == files
