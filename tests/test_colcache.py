"""The column cache file (zreplay.engine.colcache): small columns decoded once per machine
into a file every process maps, and what happens when a filler dies, a contents change,
a reboot, a full or unwritable directory, or another process reuses slots mid-read."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import builders
import numpy as np
import pytest
import zarr
from conftest import check_rows
from test_read_path import plain_rows

import zreplay
from zreplay.engine import colcache
from zreplay.sampling.clips import ClipSpec
from zreplay.store.segment import Segment

SMALL = ["actions", "rewards", "terminations", "versions", "curr_obs/states"]


@pytest.fixture
def cols(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "cols"
    monkeypatch.setenv("ZREPLAY_CACHE_DIR", str(d))
    return d


def write(path, tids, **kw):
    with closing(builders.writer(path, **kw)) as core:
        builders.add_full(core, tids)


def plain(path, key):
    seg = zarr.open_group(str(path), mode="r")["segments/default"]
    lo, hi = seg.attrs["live_rows"]
    return seg[f"data/{key}"][lo:hi]


def flat(batch: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in batch.items():
        out.update(flat(v, f"{prefix}{k}/") if isinstance(v, dict) else {prefix + k: v})
    return out


def check_all(view, path):
    idx = np.random.default_rng(0).permutation(view.num_rows)[:400]
    got = flat(view.rows(idx))
    for key in SMALL + ["curr_obs/main_images"]:
        assert np.array_equal(got[key], plain(path, key)[idx]), key


def cache_of(view):
    return view.core.engine.snapshot().parts[0].cache


def filled(tmp_path, tids=range(12)):
    """A buffer of trajectories ``tids`` and a view that filled its cache file."""
    path = tmp_path / "b"
    write(path, tids)
    view = zreplay.open(path)
    view.sample(8)
    return path, view, cache_of(view)


def test_views_and_processes_share_one_file_filled_once(tmp_path, cols):
    path = tmp_path / "b"
    write(path, range(12))
    v1 = zreplay.open(path)
    v1.sample(64)
    c1 = cache_of(v1)
    assert set(SMALL) <= set(c1.keys)
    assert c1.last_read == 0 and c1.path is not None and c1.path.parent == cols
    assert [p.suffix for p in cols.glob("*.cols")] == [".cols"]  # one file
    v2 = zreplay.open(path)
    v2.sample(64)
    c2 = cache_of(v2)
    assert c2.last_read is None and c2.path == c1.path  # found it filled: read nothing
    check_all(v2, path)
    # Another process maps the same file and reads none of the small columns.
    code = (
        "import json, sys, zreplay\n"
        f"v = zreplay.open({str(path)!r}); v.sample(64)\n"
        "c = v.core.engine.snapshot().parts[0].cache\n"
        "print(json.dumps([c.last_read, str(c.path)]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    last_read, other = json.loads(out.stdout.strip().splitlines()[-1])
    assert last_read is None and other == str(c1.path)


def test_a_filler_killed_mid_fill_publishes_nothing(tmp_path, cols):
    path = tmp_path / "b"
    write(path, range(12))
    marker = tmp_path / "reading"
    code = (
        "import time, zreplay\n"
        "from zreplay.store.segment import Segment\n"
        "orig, calls = Segment.read_range, []\n"
        "def slow(self, key, a, b):\n"
        "    calls.append(key)\n"
        f"    if len(calls) == 3: open({str(marker)!r}, 'w').close(); time.sleep(120)\n"
        "    return orig(self, key, a, b)\n"
        "Segment.read_range = slow\n"
        f"zreplay.open({str(path)!r}).sample(64)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        files = list(cols.glob("*.cols"))
        assert len(files) == 1  # made, being filled
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    view = zreplay.open(path)
    view.sample(64)
    c = cache_of(view)
    assert c.last_read == 0 and c.path == files[0]  # nothing was published: filled again
    check_all(view, path)


def test_an_interrupted_fill_leaves_nothing_published(tmp_path, cols, monkeypatch):
    path = tmp_path / "b"
    write(path, range(12))
    view = zreplay.open(path)
    orig, calls = Segment.read_range, []

    def interrupted(self, key, a, b):
        calls.append(key)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return orig(self, key, a, b)

    monkeypatch.setattr(Segment, "read_range", interrupted)
    with pytest.raises(KeyboardInterrupt):
        view.sample(64)
    c = cache_of(view)
    assert c.hi <= c.lo  # nothing valid
    monkeypatch.setattr(Segment, "read_range", orig)
    view.sample(64)
    assert c.last_read == 0 and c.hi == view.num_rows
    check_all(view, path)


def test_a_fill_a_writer_evicts_under_keeps_the_rows_still_live(tmp_path, cols, monkeypatch):
    """A writer at capacity evicts the oldest rows while a view fills its cache (a fill
    of 300M rows takes a minute; a full buffer evicts at every add): what was read of the
    rows still live is published, only the evicted ones are not, and the view's next
    sample reads only the rows added since (it used to throw the whole fill away and
    start again, and could fail to sample while the writer kept adding)."""
    path = tmp_path / "b"
    writer = builders.writer(path, capacity=12 * 18)
    builders.add_full(writer, range(12))  # 18 rows each: full
    writer.flush()
    view = zreplay.open(path)
    monkeypatch.setattr(colcache, "_FILL_BYTES", 600)  # a fill of many pieces
    orig, calls = Segment.read_range, []

    def evicting(self, key, a, b):
        calls.append(key)
        if len(calls) == 12:  # mid-fill: two more trajectories evict the two oldest
            builders.add_full(writer, (12, 13))
            writer.flush()
        return orig(self, key, a, b)

    monkeypatch.setattr(Segment, "read_range", evicting)
    got = view.sample(64)  # the fill's rows went stale: drawn again on a new snapshot
    assert len(got["rewards"]) == 64
    c = cache_of(view)
    assert view.num_rows == 12 * 18 and c.lo == 2 * 18 and c.hi == 14 * 18
    assert c.last_read == 12 * 18  # only the two new trajectories were read again
    monkeypatch.setattr(Segment, "read_range", orig)
    writer.close()
    check_all(view, path)


def test_slots_another_process_reuses_mid_read_are_read_from_the_store(tmp_path, cols, monkeypatch):
    path = tmp_path / "b"
    write(path, range(12))
    view = zreplay.open(path)
    view.sample(8)
    c = cache_of(view)
    orig = colcache.ColumnCache.gather

    def scribbled(self, key, slots, out=None):
        got = orig(self, key, slots, out)
        ring = self._ring
        ring.header[colcache._H_LO] = ring.hi - 1  # a filler took the slots meanwhile
        for arr in ring.arrays.values():
            arr[:] = 0
        return got

    monkeypatch.setattr(colcache.ColumnCache, "gather", scribbled)
    idx = np.arange(view.num_rows - 1)
    got = flat(view.rows(idx))
    for key in SMALL:
        assert np.array_equal(got[key], plain(path, key)[idx]), key
    assert c.lo == view.num_rows - 1


def test_a_new_contents_removes_the_old_file_and_never_serves_its_rows(tmp_path, cols):
    path = tmp_path / "b"
    buf = builders.writer(path)
    builders.add_full(buf, range(6))
    buf.flush()
    view = zreplay.open(path)
    view.sample(16)
    old = cache_of(view).path
    assert old.exists()
    buf.engine.clear()
    builders.add_full(buf, range(50, 56))
    buf.flush()
    view.refresh()
    r = flat(view.rows(np.arange(view.num_rows)))["rewards"][:, 0]
    assert {int(x) // 10000 for x in r} == set(range(50, 56))
    assert not old.exists() and cache_of(view).path != old
    check_all(view, path)
    buf.close()


def test_a_file_from_an_earlier_boot_is_made_anew(tmp_path, cols, monkeypatch):
    path = tmp_path / "b"
    write(path, range(12))
    zreplay.open(path).sample(8)
    monkeypatch.setattr(colcache, "_BOOT", colcache._BOOT + 1)  # a reboot since
    view = zreplay.open(path)
    view.sample(8)
    assert cache_of(view).last_read == 0  # its pages may never have reached the disk
    check_all(view, path)


def test_growing_the_ring_moves_every_process_to_the_new_file(tmp_path, cols, monkeypatch):
    monkeypatch.setattr(colcache, "MIN_SLOTS", 16)
    path = tmp_path / "b"
    buf = builders.writer(path)
    builders.add_full(buf, range(4))  # 72 rows
    buf.flush()
    v1, v2 = zreplay.open(path), zreplay.open(path)
    v1.sample(8)
    small = cache_of(v1).capacity
    assert small == 90  # a quarter more than the 72 rows
    builders.add_full(buf, range(4, 20))  # 360 rows
    buf.flush()
    v2.refresh()
    v2.sample(8)
    c2 = cache_of(v2)
    # Grew; the 72 rows v1 read are read again: their shard file was rewritten since
    # (the writer appended to it), and a file a process did not fill is served only while
    # the shard files it was filled from are unchanged (test_colcache_safety: a restore).
    assert c2.capacity >= 360 and c2.last_read == 0
    v1.refresh()
    v1.sample(8)
    c1 = cache_of(v1)
    assert c1.last_read is None and c1.capacity == c2.capacity  # mapped the new file
    assert len(list(cols.glob("*.cols"))) == 1
    check_all(v1, path)
    buf.close()


def assert_kept_in_memory(tmp_path, match: str):
    """A view of a new buffer warns (``match``) and keeps every row in its own memory."""
    path = tmp_path / "b"
    write(path, range(12))
    view = zreplay.open(path)
    with pytest.warns(RuntimeWarning, match=match):
        view.sample(8)
    c = cache_of(view)
    assert c.path is None and c.hi == view.num_rows and c.last_read == 0
    check_all(view, path)


def test_an_unusable_cache_dir_warns_and_keeps_rows_in_memory(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("ZREPLAY_CACHE_DIR", str(blocker / "cols"))
    assert_kept_in_memory(tmp_path, "ZREPLAY_CACHE_DIR")


def test_a_full_disk_keeps_the_newest_rows_that_fit(tmp_path, cols, monkeypatch):
    import shutil

    class Usage:
        total, used, free = 100 << 30, 0, 0

    path = tmp_path / "b"
    write(path, range(12))
    view = zreplay.open(path)
    c = cache_of(view)
    Usage.free = colcache.RESERVE_BYTES + 4096 + 100 * c.row_bytes  # 8 GiB < a tenth
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage)
    monkeypatch.setattr(colcache, "_warned", set())
    with pytest.warns(RuntimeWarning, match="disk room for 100 of the"):
        view.sample(8)
    assert c.capacity == 100 and c.lo == view.num_rows - 100 and c.hi == view.num_rows
    check_all(view, path)


def test_a_writers_own_sample_and_clear_use_the_file(tmp_path, cols):
    path = tmp_path / "b"
    with closing(builders.writer(path, ram_trajectories=1)) as buf:
        builders.add_full(buf, range(8))
        buf.flush()
        buf.sample(64)
        part = buf.engine.snapshot().parts[0]
        first = part.cache.path
        assert first is not None and first.exists() and part.cache.hi > 0
        buf.engine.clear()
        assert not first.exists()  # those rows are gone for everyone
        builders.add_full(buf, range(30, 38))
        buf.flush()
        r = buf.sample(256)["rewards"][..., 0]
        assert {int(x) // 10000 for x in r.ravel()} <= set(range(30, 38))


def test_a_writers_sample_never_waits_for_another_process_filling_the_file(tmp_path, cols):
    """A writer samples under its own lock: while another process holds the file's lock
    (a view filling 300M rows takes ~40 s), the writer reads the store instead."""
    import fcntl
    import threading

    with closing(builders.writer(tmp_path / "b", ram_trajectories=1)) as buf:
        builders.add_full(buf, range(8))
        buf.flush()
        buf.sample(64)  # the file holds those rows
        lock = buf.engine.snapshot().parts[0].cache.path.with_suffix(".lock")
        builders.add_full(buf, range(8, 16))
        buf.flush()  # the next sample must fill more of the file
        fd = os.open(lock, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)  # "another process" fills the file
        got = []
        t = threading.Thread(target=lambda: got.append(buf.sample(256)), daemon=True)
        try:
            t.start()
            t.join(60)
            assert not t.is_alive(), "the writer's sample waited for the other fill"
        finally:
            os.close(fd)
        t.join(60)
        r = got[0]["rewards"][..., 0]
        assert {int(x) // 10000 for x in r.ravel()} <= set(range(16))
        assert {int(x) // 10000 for x in r.ravel()} & set(range(8, 15))  # older rows too


def test_a_large_fill_lets_the_page_cache_drop_the_chunks_it_read(tmp_path, cols, monkeypatch):
    from zreplay.store.backend_local import LocalBackend

    monkeypatch.setattr(colcache, "FORGET_AFTER_ROWS", 100)
    dropped = []
    orig = LocalBackend.forget_pages
    monkeypatch.setattr(
        LocalBackend, "forget_pages", lambda self, files: (dropped.extend(files), orig(self, files))
    )
    path = tmp_path / "b"
    write(path, range(4))  # 72 rows: a small fill keeps the store's pages
    view = zreplay.open(path)
    view.sample(8)
    assert dropped == []
    write(path, range(4, 12))  # 144 more in one fill
    view.refresh()
    view.sample(8)
    c = cache_of(view)
    shards = {os.path.dirname(str(p).split("/data/")[1]) for p in dropped}
    assert shards == set(c.keys) and all(Path(p).is_file() for p in dropped)
    check_all(view, path)


def test_a_file_the_disk_cannot_hold_is_never_mapped(tmp_path, cols, monkeypatch):
    """A store into a mapped page of a sparse file on a full disk kills the process
    (SIGBUS): the file's blocks are allocated first, and where that fails the rows stay
    in the process's memory."""

    def full(fd, offset, length):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    assert_kept_in_memory(tmp_path, "No space left")
    assert list(cols.glob("*.cols")) == [] and list(cols.glob("*.tmp")) == []


def test_old_files_are_pruned_and_the_directory_may_go_at_any_time(tmp_path, cols):
    import shutil

    cols.mkdir(parents=True)
    stale, recent = cols / ("0" * 40 + ".cols"), cols / ("1" * 40 + ".cols")
    for f in (stale, recent):
        f.write_bytes(b"x")
    old = time.time() - colcache.PRUNE_AGE_S - 60
    os.utime(stale, (old, old))
    path = tmp_path / "b"
    buf = builders.writer(path)
    builders.add_full(buf, range(6))
    buf.flush()
    view = zreplay.open(path)
    view.sample(8)  # makes its file: the stale one goes, the recent one stays
    assert not stale.exists() and recent.exists()
    shutil.rmtree(cols)  # the user deletes the directory while the view maps a file
    check_all(view, path)
    builders.add_full(buf, range(6, 9))
    buf.flush()
    view.refresh()
    view.sample(8)
    check_all(view, path)
    buf.close()


def test_lock_files_of_caches_gone_are_pruned_unless_held(tmp_path, cols):
    """Lock files used to stay forever (one per contents ever read on the machine): the
    lock of a cache file gone for PRUNE_AGE_S goes, taken under its lock, so one a filler
    holds (another process, here) stays, as does the lock of a cache file still there."""
    cols.mkdir(parents=True)
    old = time.time() - colcache.PRUNE_AGE_S - 60
    gone, held, live = (cols / (c * 40 + ".lock") for c in "012")
    for f in (gone, held, live, live.with_suffix(".cols")):
        f.write_bytes(b"")
        os.utime(f, (old, old))
    live.with_suffix(".cols").touch()  # in use
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1]); "
         "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)", str(held)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        path = tmp_path / "b"
        write(path, range(6))
        view = zreplay.open(path)
        view.sample(8)  # makes its file, pruning what is old
        assert not gone.exists() and held.exists() and live.exists()
        check_all(view, path)
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_taken_on_a_pruned_lock_file_is_taken_again(tmp_path, cols, monkeypatch):
    """A process that opened a lock file which a prune then unlinked gets its flock on a
    file nobody else can see: it takes the lock again on the file now at the path."""
    path = tmp_path / "b"
    write(path, range(6))
    view = zreplay.open(path)
    real, calls = colcache.fcntl.flock, []

    def pruned_first(fd, op):
        if op & colcache.fcntl.LOCK_EX and not calls:
            calls.append(fd)
            for f in cols.glob("*.lock"):
                f.unlink()  # as a prune would, between this process's open and flock
        return real(fd, op)

    monkeypatch.setattr(colcache.fcntl, "flock", pruned_first)
    view.sample(8)
    monkeypatch.setattr(colcache.fcntl, "flock", real)
    locks = list(cols.glob("*.lock"))
    assert calls and len(locks) == 1
    fd = os.open(locks[0], os.O_RDWR)  # the fill held (and released) this very file
    try:
        real(fd, colcache.fcntl.LOCK_EX | colcache.fcntl.LOCK_NB)
    finally:
        os.close(fd)
    check_all(view, path)


def test_a_prune_never_unlinks_a_lock_file_another_process_holds(cols, monkeypatch):
    """Pruner B opens an old lock file; pruner D unlinks it and filler C makes and holds
    a new one at the path before B's flock, which then succeeds on the unlinked file:
    B must not unlink C's (found by an adversarial pass: two fillers of one file)."""
    cols.mkdir(parents=True)
    lock = cols / ("a" * 40 + ".lock")
    lock.touch()
    old = time.time() - colcache.PRUNE_AGE_S - 60
    os.utime(lock, (old, old))  # an old lock whose cache file is gone
    real, held = colcache.fcntl.flock, []

    def others_run_first(fd, op):
        if op & colcache.fcntl.LOCK_NB and not held:
            monkeypatch.setattr(colcache.fcntl, "flock", real)
            colcache._prune(cols)  # pruner D
            held.append(colcache._lock_file(lock, True))  # filler C
            monkeypatch.setattr(colcache.fcntl, "flock", others_run_first)
        return real(fd, op)

    monkeypatch.setattr(colcache.fcntl, "flock", others_run_first)
    colcache._prune(cols)  # pruner B
    monkeypatch.setattr(colcache.fcntl, "flock", real)
    try:
        assert held and lock.exists()  # C's lock file is still the one at the path
        probe = subprocess.run(
            [sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1]); "
             "fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)", str(lock)],
            capture_output=True, text=True,
        )  # fmt: skip
        assert "BlockingIOError" in probe.stderr  # another process cannot take it
    finally:
        colcache._HELD.discard(held[0])
        os.close(held[0])


def test_a_ring_that_lost_older_rows_is_not_locked_at_every_read(tmp_path, cols, monkeypatch):
    """A smaller budget in another process wrapped the shared ring past rows this view
    wants: they come from the store, without taking the file's lock at every read."""
    path = tmp_path / "b"
    write(path, range(12))
    row_bytes = cache_of(zreplay.open(path)).row_bytes
    tiny = zreplay.open(path, column_cache_bytes=100 * row_bytes)  # 100 rows
    tiny.sample(8)
    c = cache_of(tiny)
    assert c.lo == tiny.num_rows - 100
    big = zreplay.open(path)
    locks = []
    orig = colcache.ColumnCache._exclusive
    monkeypatch.setattr(
        colcache.ColumnCache, "_exclusive", lambda self, p: (locks.append(p), orig(self, p))[1]
    )
    for _ in range(5):
        big.sample(64)
    assert len(locks) == 1  # once, to find nothing to read below the ring's lo
    check_all(big, path)


def test_a_fork_during_a_fill_never_keeps_the_lock(tmp_path, cols):
    import fcntl

    _, _, c = filled(tmp_path, range(4))
    lock = c.path.with_suffix(".lock")
    with c._exclusive(c.path):
        pid = os.fork()
        if pid == 0:  # the child (a fork-context DataLoader worker) lives on a while
            time.sleep(5)
            os._exit(0)
    try:
        fd = os.open(lock, os.O_RDWR)
        try:  # the parent let go: another process gets the lock while the child lives
            deadline = time.monotonic() + 2  # (the child closes its copy as it starts)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    assert time.monotonic() < deadline, "the forked child kept the lock"
                    time.sleep(0.02)
        finally:
            os.close(fd)
    finally:
        os.waitpid(pid, 0)


def test_a_files_lo_never_goes_down(tmp_path, cols):
    """A filler that started afresh at higher rows and died left the ring empty at its
    rows; a filler of lower rows makes a new file rather than lower lo under readers."""
    path, _, c = filled(tmp_path)
    first, ring = c.path, c._ring
    ino = first.stat().st_ino
    ring.header[colcache._H_LO] = ring.header[colcache._H_HI] = 10_000  # the dead filler's
    other = zreplay.open(path)
    other.sample(8)
    assert cache_of(other).path.stat().st_ino != ino and ring.lo == 10_000
    check_all(other, path)


def test_a_directory_saved_over_is_another_cache(tmp_path, cols):
    """A checkpoint keeps its writer's contents id: a directory resumed and then saved
    over (or restored from a backup) holds other rows under the same id."""
    src, ckpt = tmp_path / "src", tmp_path / "ckpt"
    a = builders.writer(src)
    builders.add_full(a, range(6))
    a.engine.checkpoint(ckpt)
    b = builders.writer(ckpt)
    builders.add_full(b, range(50, 56))
    b.close()
    zreplay.open(ckpt).sample(8)  # caches the resumed history
    builders.add_full(a, range(6, 12))
    a.engine.checkpoint(ckpt)  # saved over: the first history again, longer
    a.close()
    view = zreplay.open(ckpt)
    r = flat(view.rows(np.arange(view.num_rows)))["rewards"][:, 0]
    assert {int(x) // 10000 for x in r} == set(range(12))
    check_all(view, ckpt)


def test_no_memory_for_a_mapping_reads_the_store(tmp_path, cols, monkeypatch):
    """mmap failing (ENOMEM: no address space or memory) for the file and for process
    memory alike leaves the rows to the store: every read still exact, no error."""
    import mmap as mmap_module

    path = tmp_path / "b"
    write(path, range(12))

    class NoMemory:
        def __init__(self, *a, **k):
            raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(colcache.mmap, "mmap", NoMemory)
    with pytest.warns(RuntimeWarning, match="Cannot allocate memory"):
        view = zreplay.open(path)
        check_all(view, path)
    monkeypatch.setattr(colcache.mmap, "mmap", mmap_module.mmap)
    check_all(view, path)  # and stay so once memory is back


def cache_files(cols):
    return sorted(cols.glob("*.cols"))


def test_files_of_buffers_deleted_or_replaced_are_removed_when_a_file_is_made(tmp_path, cols):
    """Files used to stay 7 days after their buffer went (12 buffers made, sampled and
    deleted left 13 files for 1 live buffer)."""
    import shutil

    paths = [tmp_path / f"b{i}" for i in range(4)]
    for p in paths:
        write(p, range(3))
        zreplay.open(p).sample(4)
    assert len(cache_files(cols)) == 4
    shutil.rmtree(paths[0])  # deleted
    shutil.rmtree(paths[1])
    write(paths[1], range(3))  # made again at the same path: another directory
    write(paths[2], range(3), overwrite=True)  # replaced: other contents
    live = tmp_path / "live"
    write(live, range(3))
    view = zreplay.open(live)
    view.sample(4)  # makes a file: the three of buffers gone go
    left = cache_files(cols)
    assert len(left) == 2 and cache_of(view).path in left
    assert not [
        f
        for f in cols.iterdir()
        if f.suffix in (".stamps", ".owner") and not f.with_suffix(".cols").exists()
    ]
    zreplay.open(paths[3]).sample(4)  # the live buffer's file is still served
    assert cache_files(cols) == left


def test_the_directory_is_capped_least_recently_used_first(tmp_path, cols, monkeypatch):
    paths = [tmp_path / f"b{i}" for i in range(4)]
    views = []
    for p in paths:
        write(p, range(3))
        views.append(zreplay.open(p))
    views[0].sample(4)
    one = cache_files(cols)[0].stat().st_blocks * 512
    monkeypatch.setenv("ZREPLAY_CACHE_MAX_BYTES", str(2 * one + one // 2))
    for v in views[1:]:
        time.sleep(0.01)  # (mtimes order the files)
        v.sample(4)
    left = cache_files(cols)
    assert len(left) == 2 and sum(f.stat().st_blocks * 512 for f in left) <= 2.5 * one
    assert set(left) == {cache_of(views[2]).path, cache_of(views[3]).path}
    for v, p in zip(views, paths, strict=True):
        check_all(v, p)  # a view whose file went still reads its rows


def test_a_small_buffer_gets_a_small_file(tmp_path, cols):
    path, view, c = filled(tmp_path, range(6))  # 108 rows
    assert view.num_rows == 108 and c.capacity < 1024
    assert c.path.stat().st_size < 1024 * c.row_bytes + (len(c.keys) + 1) * 4096


def test_column_cache_serves_small_keys_and_follows_refresh(stored, tmp_path):
    import shutil

    path = tmp_path / "buf"
    shutil.copytree(stored, path)
    view = zreplay.open(path, seed=1)
    check_rows(view.sample(200))
    seg = view.core.engine.snapshot().parts[0]
    assert seg.cache is not None and set(seg.cache.keys) >= {"rewards", "actions"}
    assert "curr_obs/main_images" in seg.cache.keys  # 8x8x3 images are 192 B: small too
    assert seg.cache.hi == view.num_rows  # filled on first use
    with closing(builders.writer(path)) as buf:
        builders.add_full(buf, range(12, 15))
    assert view.refresh()
    clips = flat(view.clips(np.arange(view.num_clips(history_len=2)), history_len=2))
    codes = clips["rewards"][..., 0]
    assert {int(c) // 10000 for c in codes.ravel()} == set(range(15))  # new rows seen
    assert np.array_equal(clips["curr_obs/states"][..., 0], codes)
    assert seg.cache is view.core.engine.snapshot().parts[0].cache  # same rows: kept


def test_small_column_budget_holds_only_the_newest_rows(stored, tmp_path):
    import shutil

    stored = shutil.copytree(stored, tmp_path / "own")  # its own cache file, filled here
    view = zreplay.open(stored, column_cache_bytes=4096)
    batch = view.rows(np.arange(view.num_rows))
    for key in view.keys():
        assert np.array_equal(flat(batch)[key], plain_rows(stored, key)), key
    cache = view.core.engine.snapshot().parts[0].cache
    assert 0 < cache.hi - cache.lo < view.num_rows and cache.nbytes <= 4096


def test_writer_reads_old_small_rows_from_its_column_cache(tmp_path):
    with closing(builders.writer(tmp_path / "b", ram_trajectories=1)) as buf:
        builders.add_full(buf, range(8))
        buf.flush()
        for _ in range(5):
            check_rows(builders.nested(buf.sample(128)))
        clips = builders.nested(buf.sample_clips(ClipSpec(history_len=3), 64))
        r = clips["rewards"][..., 0]
        assert np.all(np.diff(r, axis=1) == 1)  # consecutive steps of one lane
        assert np.array_equal(clips["curr_obs"]["states"][..., 0], r)
        part = buf.engine.snapshot().parts[0]
        assert part.cache is not None and part.cache.hi > part.cache.lo  # it was used


def test_column_cache_knobs(stored, tmp_path):
    def cache(obj):
        return getattr(obj, "core", obj).engine.snapshot().parts[0].cache  # a view's, a core's

    assert cache(zreplay.open(stored, column_cache_bytes=0)) is None
    c = cache(zreplay.open(stored))
    specs = zreplay.open(stored).schema.specs
    from zreplay.engine.colcache import default_budget

    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert default_budget() == ram  # the default budget is the machine's RAM
    assert zreplay.open(stored).core.engine.chunk_cache_bytes == ram // 16
    assert zreplay.open(stored, chunk_cache_bytes=0).core.engine.chunk_cache_bytes == 0
    assert c.max_rows == ram // sum(specs[k].row_bytes for k in c.keys)
    assert all(specs[k].row_bytes <= 1024 for k in c.keys)
    path = str(tmp_path / "b")
    with closing(builders.writer(path)) as buf:
        builders.add_full(buf, [0])
        assert cache(buf) is not None
    with closing(builders.writer(path, ram_trajectories=0)) as buf:
        assert cache(buf) is None  # RAM tier off: every committed row is read from disk
