"""The column cache (zreplay.engine.colcache) as something others may tamper with: a
cache directory other users can write, files they plant there, links."""

from __future__ import annotations

import os
import shutil
import warnings
from contextlib import closing
from pathlib import Path

import builders
import numpy as np
import pytest
import zarr

import zreplay
from zreplay.engine import colcache

OTHER_UID = 65534
KEYS = [  # make_traj's keys (all of them small enough for the column cache)
    "actions", "rewards", "terminations", "truncations", "dones", "versions",
    "prev_logprobs", "intervene_flags", "curr_obs/states", "next_obs/states",
    "curr_obs/main_images", "next_obs/main_images",
]  # fmt: skip  # "nobody": a file another user planted


@pytest.fixture
def cols(tmp_path, monkeypatch):
    d = tmp_path / "cols"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("ZREPLAY_CACHE_DIR", str(d))
    monkeypatch.setattr(colcache, "_warned", set())
    return d


def write(path, tids):
    with closing(builders.writer(path)) as core:
        builders.add_full(core, tids)


def stored_rewards(path):
    seg = zarr.open_group(str(path), mode="r")["segments/default"]
    lo, hi = seg.attrs["live_rows"]
    return seg["data/rewards"][lo:hi]


def all_rewards(view):
    return np.asarray(view.rows(np.arange(view.num_rows))["rewards"])


def cache_of(view):
    return view.core.engine.snapshot().parts[0].cache


def planted(tmp_path, cols):
    """A buffer, and the cache file its views use, rewritten to serve rewards 666."""
    path = tmp_path / "b"
    write(path, range(6))
    view = zreplay.open(path)
    view.sample(8)
    c = cache_of(view)
    file = c.path
    assert file is not None and file.parent == cols
    c.gather("rewards", np.arange(c.capacity))  # the file holds the rows
    arr = np.memmap(file, mode="r+", dtype=np.uint8)
    ring = colcache._Ring(arr, c._specs, c.capacity, file)  # the planter's own writes
    ring.arrays["rewards"][:] = 666
    arr.flush()
    del ring, arr, view, c
    return path, file


def test_a_cache_file_in_a_directory_others_can_write_is_never_served(tmp_path, cols):
    path, file = planted(tmp_path, cols)
    os.chown(file, OTHER_UID, OTHER_UID)
    cols.chmod(0o777)  # a shared /tmp path: anyone can put a file under that name
    view = zreplay.open(path)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = all_rewards(view)
    assert np.array_equal(got, stored_rewards(path)) and not (got == 666).any()
    assert cache_of(view).path is None  # this process's memory
    assert any("writable by other users" in str(w.message) for w in seen)


def test_a_cache_file_another_user_owns_is_never_served(tmp_path, cols):
    path, file = planted(tmp_path, cols)
    os.chown(file, OTHER_UID, OTHER_UID)  # the directory is ours, the file is not
    view = zreplay.open(path)
    got = all_rewards(view)
    assert np.array_equal(got, stored_rewards(path)) and not (got == 666).any()


def test_a_planted_lock_link_never_creates_its_target(tmp_path, cols):
    path = tmp_path / "b"
    write(path, range(6))
    view = zreplay.open(path)
    view.sample(8)
    file = cache_of(view).path
    del view
    for f in cols.iterdir():
        f.unlink()
    victim = tmp_path / "victim"
    file.with_suffix(".lock").symlink_to(victim)
    view = zreplay.open(path)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = all_rewards(view)
    assert not victim.exists()
    assert np.array_equal(got, stored_rewards(path))
    assert any("cannot keep small columns" in str(w.message) for w in seen)


def restore(backup, path):
    """What ``rsync -a --delete backup/ path/`` does: directories kept (same inodes),
    files that differ by size or mtime copied over (a temporary renamed into place, the
    mtime kept), files the backup lacks deleted."""
    for d, dirs, files in os.walk(backup):
        rel = os.path.relpath(d, backup)
        dst = path / rel
        dst.mkdir(exist_ok=True)
        keep = set(dirs) | set(files)
        for name in os.listdir(dst):
            if name not in keep:
                p = dst / name
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        for name in files:
            src, out = Path(d) / name, dst / name
            a = src.stat()
            if out.exists() and (out.stat().st_size, out.stat().st_mtime_ns) == (
                a.st_size,
                a.st_mtime_ns,
            ):
                continue
            shutil.copy2(src, dst / f".{name}.rsync")
            os.replace(dst / f".{name}.rsync", out)


def test_a_buffer_restored_in_place_and_written_again_serves_what_it_holds(tmp_path, cols):
    path, backup = tmp_path / "b", tmp_path / "backup"
    buf = builders.writer(path)
    builders.add_full(buf, range(6))
    buf.close()
    shutil.copytree(path, backup)  # the older copy
    ino = path.stat().st_ino
    buf = builders.writer(path)
    builders.add_full(buf, range(6, 12))
    buf.close()
    view = zreplay.open(path)
    view.sample(8)  # fills the cache file with the history about to be replaced
    del view
    restore(backup, path)
    assert path.stat().st_ino == ino
    buf = builders.writer(path)
    builders.add_full(buf, range(50, 56))  # other rows, same numbers
    buf.close()
    view = zreplay.open(path)
    got = all_rewards(view)
    assert np.array_equal(got, stored_rewards(path))
    assert {int(x) // 10000 for x in got[:, 0]} == {*range(6), *range(50, 56)}
    idx = np.random.default_rng(0).integers(0, view.num_rows, 64)
    assert np.array_equal(np.asarray(view.rows(idx)["rewards"]), stored_rewards(path)[idx])


def test_a_bucket_prefix_restored_from_a_backup_and_written_again_serves_what_it_holds(
    url, s3, cols
):
    s3fs = pytest.importorskip("s3fs")
    fs = s3fs.S3FileSystem(**s3)
    key, backup = url[len("s3://") :], url[len("s3://") :] + "-backup"

    def add(tids):
        with closing(builders.writer(url, storage_options=s3)) as buf:
            builders.add_full(buf, tids)

    add(range(6))
    fs.copy(key, backup, recursive=True)
    add(range(6, 12))
    zreplay.open(url, storage_options=s3).sample(8)  # fills the cache file
    fs.rm(key, recursive=True)  # the prefix deleted, the backup copied back
    fs.copy(backup, key, recursive=True)
    fs.invalidate_cache()
    add(range(50, 56))  # other rows, same numbers, same contents id
    got = all_rewards(zreplay.open(url, storage_options=s3))
    plain = zreplay.open(url, storage_options=s3, column_cache_bytes=0)
    assert np.array_equal(got, all_rewards(plain))
    assert {int(x) // 10000 for x in got[:, 0]} == {*range(6), *range(50, 56)}


def test_a_bucket_file_is_served_to_the_next_process_while_its_shards_are_unchanged(url, s3, cols):
    """In S3 rows are proven by their shards' ETags (one listing per key): a second view
    reads nothing, and after a commit only the rows of the shard it rewrote."""
    layout = {k: {"chunk_rows": 4, "shard_rows": 32} for k in KEYS}
    opts = {"storage_options": s3, "layout": layout}
    with closing(builders.writer(url, **opts)) as buf:
        builders.add_full(buf, range(6))  # 108 rows: 3 shards + 12
    zreplay.open(url, storage_options=s3).sample(8)
    view = zreplay.open(url, storage_options=s3)
    got = all_rewards(view)
    assert cache_of(view).last_read is None  # every row served from the file
    with closing(builders.writer(url, **opts)) as buf:
        builders.add_full(buf, [6])  # rows 108..125: shard 96 rewritten
    view = zreplay.open(url, storage_options=s3)
    got = all_rewards(view)
    assert cache_of(view).last_read == 96
    plain = zreplay.open(url, storage_options=s3, column_cache_bytes=0)
    assert np.array_equal(got, all_rewards(plain))
