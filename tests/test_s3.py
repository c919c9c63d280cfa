"""Buffers in an S3 bucket, against a real S3 endpoint: moto's server on 127.0.0.1.

Everything goes over HTTP through s3fs and zarr's fsspec store, as it would against AWS
or MinIO: create, append, reopen, sample, refresh from another process, several writer
processes, checkpoint (server-side copies), load into a local buffer, verify.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import uuid

import builders
import numpy as np
import pytest
from conftest import S3_BUCKET, check_rows, make_traj, traj_equal

import zreplay
from zreplay.errors import CorruptBufferError, WriterLockedError

pytest.importorskip("moto.server")
pytest.importorskip("s3fs")
BUCKET = S3_BUCKET


def _writer(url: str, options: dict, writer_id: str, tids: list[int], q) -> None:
    buf = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=url, storage_options=options, writer_id=writer_id
    )
    ids = []
    for t in tids:
        buf.add_trajectories([make_traj(t, T=4, B=2)])
        buf.flush()
        ids.append(buf.trajectory(len(buf) - 1)["trajectory_id"])
    buf.close()
    q.put((writer_id, ids))


def test_shards_larger_than_any_record_copy_between_a_disk_and_s3(url, s3, tmp_path, monkeypatch):
    """Records are read whole only up to a bound (a buffer may come from a stranger);
    data files copied whole between stores (a checkpoint saved from a disk to S3, loaded
    from S3 to a disk) are not records: a layout may make shards of any size.  The bound
    is lowered to 16 KiB here, under these shards' size."""
    from zreplay.store import backend_local, backend_s3

    layout = {"curr_obs/main_images": {"codec": "none", "chunk_rows": 128, "shard_rows": 256}}
    trajs = [make_traj(t, T=32, B=8) for t in range(2)]
    local = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(tmp_path / "a"), layout=layout
    )
    local.add_trajectories(trajs)
    local.flush()
    sizes = [p.stat().st_size for p in (tmp_path / "a").rglob("*") if p.is_file()]
    assert max(sizes) > 16 << 10  # a shard of 256 rows of 8x8x3 frames
    local.save_checkpoint(str(tmp_path / "ck"))
    local.close()
    monkeypatch.setattr(backend_local, "MAX_READ_BYTES", 16 << 10)
    monkeypatch.setattr(backend_s3, "MAX_READ_BYTES", 16 << 10)
    remote = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=url, storage_options=s3, layout=layout
    )
    remote.load_checkpoint(str(tmp_path / "ck"))  # disk -> S3
    ckpt = url.rsplit("/", 1)[0] + "/ckpt"
    remote.save_checkpoint(ckpt)
    remote.close()
    back = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path / "b"))
    back.load_checkpoint(ckpt, storage_options=s3)  # S3 -> disk
    assert len(back) == 2
    traj_equal(back.trajectory(1), trajs[1])
    back.close()
    assert zreplay.verify(str(tmp_path / "b")).ok


@pytest.mark.parametrize("planted", ["a link to a file outside", "a sparse giant file"])
def test_a_copy_to_s3_refuses_what_a_crafted_buffer_plants(url, s3, tmp_path, monkeypatch, planted):
    """Loading a local buffer into one on S3 copies its files: a symbolic link is never
    followed (its target would be uploaded) and no file larger than a copy may hold
    (here lowered to 64 KiB; sparse: KBs on disk) is read; the S3 buffer keeps what it
    had."""
    from zreplay.store import backend_local

    src = tmp_path / "src"
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(src)) as b:
        b.add_trajectories([make_traj(1)])
    where = src / "segments" / "default" / "zreplay" / "notes"
    secret = tmp_path / "secret"
    secret.write_text("credentials")
    if planted == "a link to a file outside":
        where.symlink_to(secret)
    else:
        with open(where, "wb") as f:
            f.truncate(1 << 20)
        monkeypatch.setattr(backend_local, "max_copy_bytes", lambda: 64 << 10)
    remote = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=url, storage_options=s3)
    remote.add_trajectories([make_traj(0)])
    with pytest.raises(zreplay.CorruptBufferError):
        remote.load_checkpoint(str(src))
    assert len(remote) == 1
    remote.close()
    from zreplay.store.location import locate

    root = locate(url, s3)
    assert not any(loc.read_bytes() == b"credentials" for _, loc in root.backend.walk_files(root))


def test_create_append_reopen_sample_checkpoint(url, s3, tmp_path):
    trajs = [make_traj(t) for t in range(3)]
    buf = zreplay.TrajectoryReplayBuffer(
        seed=0, auto_save=True, auto_save_path=url, storage_options=s3, sample_window_size=0
    )
    buf.add_trajectories(trajs[:2])
    buf.flush()
    check_rows(buf.sample(64))
    buf.close()

    buf = zreplay.TrajectoryReplayBuffer(
        seed=0, auto_save=True, auto_save_path=url, storage_options=s3, enable_cache=False
    )
    assert len(buf) == 2
    buf.add_trajectories(trajs[2:])
    buf.flush()
    for i, want in enumerate(trajs):
        traj_equal(buf.trajectory(i), want)
    check_rows(buf.sample(64))  # every row from the bucket (no RAM tier)

    ckpt = url.rsplit("/", 1)[0] + "/ckpt"
    buf.save_checkpoint(ckpt)
    buf.close()
    view = zreplay.open(ckpt, storage_options=s3)
    assert view.num_trajectories == 3
    traj_equal(view.trajectory(1), trajs[1])

    local = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path / "l"))
    local.load_checkpoint(ckpt, storage_options=s3)
    assert len(local) == 3
    traj_equal(local.trajectory(2), trajs[2])
    local.close()
    report = zreplay.verify(url, storage_options=s3)
    assert report.ok, report
    assert report.trajectories == 3 and report.rows_checked > 0


@pytest.mark.slow  # a multi-process soak: python -m pytest -m slow
def test_writer_processes_share_a_bucket_and_a_reader_refreshes(url, s3):
    view = None
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [
        ctx.Process(target=_writer, args=(url, s3, f"w{i}", list(range(10 * i, 10 * i + 3)), q))
        for i in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    got = dict(q.get(timeout=10) for _ in procs)
    view = zreplay.open(url, storage_options=s3)
    assert view.writer_ids == ["w0", "w1"]
    assert view.num_trajectories == 6
    ids = [view.trajectory(i)["trajectory_id"] for i in range(6)]
    assert sorted(ids) == sorted(got["w0"] + got["w1"])
    assert len(set(ids)) == 6  # unique across writers
    check_rows(view.sample(128))

    # A writer in this process appends; the view sees it only after refresh().
    buf = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=url, storage_options=s3, writer_id="w2"
    )
    buf.add_trajectories([make_traj(99, T=4, B=2)])
    buf.flush()
    assert view.num_trajectories == 6
    assert view.refresh()
    assert view.num_trajectories == 7
    with pytest.raises(WriterLockedError, match="being written"):
        zreplay.TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=url, storage_options=s3, writer_id="w2"
        )
    buf.close()


def test_episode_buffer_and_damage_reported(url, s3):
    rb = zreplay.ReplayBuffer(1000, history_len=3, path=url, storage_options=s3, seed=1)
    for e in range(4):
        n = 5 + e
        rb.write_episode(
            {"obs": np.full((n, 2), e, np.float32), "action": np.zeros((n, 1), np.float32)}
        )
    rb.flush()
    clip = rb.sample(8)
    assert clip["obs"].shape == (8, 3, 2)
    # a clip never crosses an episode: all frames of a clip carry the same episode
    assert (clip["obs"][:, :, 0] == clip["obs"][:, :1, 0]).all()
    rb.close()
    rb = zreplay.ReplayBuffer(1000, history_len=3, path=url, storage_options=s3)
    assert rb.num_episodes == 4
    rb.close()
    # DataLoader workers reopen the bucket from the pickled view (URL + storage options).
    from torch.utils.data import DataLoader

    ds = zreplay.ClipDataset(zreplay.open(url, storage_options=s3), history_len=3)
    loader = DataLoader(ds, batch_size=4, num_workers=1, multiprocessing_context="spawn")
    frames = np.concatenate([b["obs"][:, :, 0].numpy() for b in loader])
    assert len(frames) == len(ds) == sum(5 + e - 2 for e in range(4))
    assert (frames == frames[:, :1]).all()

    # Flip one byte of a stored chunk in the bucket: reads fail loudly, verify names it.
    import s3fs

    fs = s3fs.S3FileSystem(**s3)
    shard = url[len("s3://") :] + "/segments/default/data/obs/c.0.0"
    raw = bytearray(fs.cat_file(shard))
    raw[10] ^= 0xFF
    fs.pipe_file(shard, bytes(raw))
    # The DataLoader worker filled the column cache file, but the shard its rows came
    # from is not the one it read any more (its ETag changed): they are read again.
    for cache_bytes in (None, 0):
        view = zreplay.open(url, storage_options=s3, column_cache_bytes=cache_bytes)
        with pytest.raises(CorruptBufferError, match="'obs'"):
            view.episode(0)
    report = zreplay.verify(url, storage_options=s3)
    assert not report.ok and "'obs'" in report.problems[0]


@pytest.mark.slow  # a multi-process soak: python -m pytest -m slow
def test_command_line_reads_a_bucket_through_the_aws_environment(url, s3):
    import json
    import os
    import subprocess
    import sys

    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=url, storage_options=s3)
    buf.add_trajectories([make_traj(0), make_traj(1)])
    buf.close()
    env = dict(
        os.environ,
        AWS_ENDPOINT_URL=s3["endpoint_url"],
        AWS_ACCESS_KEY_ID=s3["key"],
        AWS_SECRET_ACCESS_KEY=s3["secret"],
    )
    run = [sys.executable, "-m", "zreplay.cli"]
    out = subprocess.run([*run, "info", url, "--json"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["trajectories"] == 2 and info["disk_bytes"] > 0
    out = subprocess.run([*run, "verify", url], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr
    missing = url + "-missing"
    out = subprocess.run([*run, "info", missing], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "no such file" in out.stderr


# -- the S3 backend's own read and write paths ---------------------------------------------

# Small chunks and shards, so a few trajectories span many shards, chunks fill up across
# commits and the newest shard is rewritten by every commit.
LAYOUT = {
    "curr_obs/main_images": {"chunk_rows": 1, "shard_rows": 16},
    "actions": {"chunk_rows": 4, "shard_rows": 32},
    "curr_obs/states": {"chunk_rows": 8, "shard_rows": 64},
}


class Requests:
    """Counts the calls of the S3 backend's request methods (get, put, create, delete,
    list, head, copy) and the objects each ``get`` asked for, by kind."""

    def __init__(self, backend, monkeypatch):
        self.calls: dict[str, int] = {}
        self.gets = {"whole": 0, "suffix": 0, "range": 0}
        self.fail_put = None  # a predicate on keys: raise OSError for matching PUTs
        self.put_keys: list[str] = []
        for name in ("get", "put", "create", "delete", "list", "head", "copy"):
            monkeypatch.setattr(backend, name, self._wrap(name, getattr(backend, name)))

    def _wrap(self, name, fn):
        def call(*args, **kwargs):
            if threading.current_thread().name == "zreplay-lease":
                return fn(*args, **kwargs)  # the writer lock's renewals, every lease/6
            self.calls[name] = self.calls.get(name, 0) + 1
            if name == "get":
                for _, rng in args[0]:
                    kind = "whole" if rng is None else "suffix" if rng[0] < 0 else "range"
                    self.gets[kind] += 1
            if name == "put":
                self.put_keys += [k for k, _ in args[0]]
                if self.fail_put and any(self.fail_put(k) for k, _ in args[0]):
                    raise OSError(28, "No space left on device (injected)")
            return fn(*args, **kwargs)

        return call

    def reset(self):
        self.put_keys.clear()
        self.calls.clear()
        self.gets = dict.fromkeys(self.gets, 0)


def _backend(url, options):
    from zreplay.store.location import locate

    return locate(url, options).backend


def _twin(url, options, tmp_path, n, **kwargs):
    """The same trajectories written to S3 and to a local directory (same layout)."""
    bufs = [
        zreplay.TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=p, storage_options=o, layout=LAYOUT, **kwargs
        )
        for p, o in ((url, options), (str(tmp_path / "local"), None))
    ]
    for t in range(n):
        for b in bufs:
            b.add_trajectories([make_traj(t, T=5, B=3)])
            b.flush()
    for b in bufs:
        b.close()
    # The S3 view keeps no column cache: every read below goes to the bucket (these rows,
    # images included, are small enough for the cache to serve them all from RAM).
    s3_view = zreplay.open(url, storage_options=options, column_cache_bytes=0)
    return s3_view, zreplay.open(str(tmp_path / "local"))


def _assert_same(got: dict, want: dict) -> None:
    for k, v in want.items():
        if isinstance(v, dict):
            _assert_same(got[k], v)
        else:
            np.testing.assert_array_equal(got[k], v, err_msg=k)


def test_s3_samples_are_bit_exact_and_cached_indexes_save_requests(url, s3, tmp_path, monkeypatch):
    view, local = _twin(url, s3, tmp_path, 6)
    assert view.num_rows == local.num_rows == 90
    rng = np.random.default_rng(0)
    req = Requests(_backend(url, s3), monkeypatch)
    for _ in range(4):
        pos = rng.choice(view.num_rows, 40)
        _assert_same(view.rows(pos), local.rows(pos))
    for i in range(view.num_trajectories):
        _assert_same(view.trajectory(i), local.trajectory(i))
    # Every shard index is now cached: a read of rows in complete chunks is one round of
    # ranged GETs per key (rows of a chunk still filling up need a fresh index first; the
    # small keys' one shard is fetched whole, index and chunks in one GET), then one GET
    # of the commit record, which proves the rows read are still the snapshot's (not
    # another contents' at the same row numbers: a loaded checkpoint, overwrite=True).
    req.reset()
    pos = rng.choice(64, 40)
    _assert_same(view.rows(pos), local.rows(pos))
    keys = len(view.keys())
    assert req.gets["suffix"] == 0, req.gets
    assert req.calls["get"] <= keys + 1, req.calls
    # The 16-row image shards hold 40 random rows in at most 6 shards: ranges merge.
    assert req.gets["range"] + req.gets["whole"] <= keys * 6, req.gets


def test_s3_a_view_keeps_decoded_chunks_and_reads_them_once(url, s3, monkeypatch):
    layout = {k: {"chunk_rows": 4, "shard_rows": 16} for k in ("obs", "action")}
    rb = zreplay.ReplayBuffer(1000, path=url, storage_options=s3, layout=layout)
    for e in range(8):
        rb.write_episode(
            {
                "obs": np.full((10, 3), e, np.float32) + np.arange(10)[:, None],
                "action": np.full((10, 1), e, np.float32),
            }
        )
    rb.close()
    pos = np.random.default_rng(2).choice(80, 40)  # rows of complete, committed chunks
    # No column cache: every key is read through the chunk cache (or the bucket).
    view = zreplay.open(url, storage_options=s3, column_cache_bytes=0)
    req = Requests(_backend(url, s3), monkeypatch)
    first = view.rows(pos)
    assert req.gets["range"] + req.gets["whole"] > 1
    req.reset()
    again = view.rows(pos[::-1])
    for k in first:
        np.testing.assert_array_equal(again[k], first[k][::-1])
    assert req.calls["get"] == 1 and req.gets["whole"] == 1, (req.calls, req.gets)  # commit
    off = zreplay.open(url, storage_options=s3, column_cache_bytes=0, chunk_cache_bytes=0)
    off.rows(pos)
    req.reset()
    for k, v in off.rows(pos).items():
        np.testing.assert_array_equal(v, first[k])
    assert req.gets["range"] + req.gets["whole"] > 1  # without it, every read fetches


def test_s3_a_view_keeps_the_chunks_a_read_brought_back_beside_those_it_needed(
    url, s3, monkeypatch
):
    """A ranged GET (merged across small gaps) and a shard fetched whole bring back chunks
    nobody asked for: the view keeps them, encoded, and a later read of their rows makes
    no request for them, with the same rows a view without caches reads.  A shard whose
    wanted chunks are close enough for the merged ranges to span it is fetched whole (one
    request, no index round)."""
    import s3fs

    rng = np.random.default_rng(5)
    layout = {
        "frame": {"chunk_rows": 1, "shard_rows": 256},  # 3 MiB a shard: ranged reads
        "state": {"chunk_rows": 4, "shard_rows": 16},  # 192 B a shard: fetched whole
    }
    rb = zreplay.ReplayBuffer(1000, path=url, storage_options=s3, layout=layout)
    for _ in range(4):
        rb.write_episode(
            {
                "frame": rng.integers(0, 255, (64, 64, 64, 3), np.uint8),
                "state": rng.standard_normal((64, 3)).astype(np.float32),
            }
        )
    rb.close()
    view = zreplay.open(url, storage_options=s3, column_cache_bytes=0)
    plain = zreplay.open(url, storage_options=s3, column_cache_bytes=0, chunk_cache_bytes=0)
    req = Requests(_backend(url, s3), monkeypatch)
    view.rows(np.array([0, 40]))  # frames: the index, then one ranged GET; states whole
    assert req.gets["range"] == 1 and req.gets["suffix"] == 1, req.gets
    req.reset()
    between = np.array([1, 7, 33, 39, 2, 5, 14])  # inside what those requests brought
    got = view.rows(between)
    assert req.gets["range"] == 0 and req.calls["get"] == 1, (req.calls, req.gets)  # commit
    for k, v in plain.rows(between).items():
        np.testing.assert_array_equal(got[k], v)
    req.reset()
    got = view.rows(np.array([60, 100]))  # beyond the range: read from the store
    assert req.gets["range"] == 1, req.gets
    for k, v in plain.rows(np.array([60, 100])).items():
        np.testing.assert_array_equal(got[k], v)
    # Damage in a chunk held this way is still damage: a read of it fails as it would
    # without the cache (the held bytes fail their checksum, the store's too).
    fs = s3fs.S3FileSystem(**s3)
    shard = url[len("s3://") :] + "/segments/default/data/frame/c.0.0.0.0"
    raw = bytearray(fs.cat_file(shard))
    index = np.frombuffer(bytes(raw[-(16 * 256 + 4) : -4]), "<u8").reshape(-1, 2)
    raw[int(index[2, 0]) + 100] ^= 0xFF  # inside chunk 2 (row 2)
    fs.pipe_file(shard, bytes(raw))
    fresh = zreplay.open(url, storage_options=s3, column_cache_bytes=0)
    fresh.rows(np.array([1, 41]))  # holds chunk 2's damaged bytes beside those
    with pytest.raises(CorruptBufferError, match="frame"):
        fresh.rows(np.array([2]))
    np.testing.assert_array_equal(fresh.rows(np.array([3]))["frame"], plain.rows([3])["frame"])
    # A few adjacent chunks (a clip) of a fresh view: the index and one range, not the
    # shard (3 MiB for 48 KiB).
    adjacent = zreplay.open(url, storage_options=s3, column_cache_bytes=0)
    req.reset()
    adjacent.rows(np.arange(100, 104))
    assert req.gets["suffix"] == 1 and req.gets["range"] == 1, req.gets
    # Chunks spread over the shard, at most GAP apart on average (random rows): the
    # merged ranges would span most of it, so it comes whole, in one request.
    spread = zreplay.open(url, storage_options=s3, column_cache_bytes=0)
    req.reset()
    spread.rows(np.array([10, 60, 120, 180, 250]))
    assert req.gets["suffix"] == 0 and req.gets["range"] == 0, req.gets
    req.reset()
    got = spread.rows(np.array([0, 3, 121, 255]))  # chunk 2 is damaged: not among these
    assert req.calls["get"] == 1 and req.gets["range"] == 0, (req.calls, req.gets)
    for k, v in plain.rows(np.array([0, 3, 121, 255])).items():
        np.testing.assert_array_equal(got[k], v)


def test_s3_index_cache_follows_commits_while_the_newest_rows_are_sampled(
    url, s3, tmp_path, monkeypatch
):
    """Every commit rewrites the newest shards (chunks fill up, shards complete); a view
    that samples the newest rows after each refresh reads them right, and never has to
    throw away an index it trusted (which would show as a third round of requests)."""
    writer = builders.writer(url, storage_options=s3, layout=LAYOUT)
    writer.add([builders.full(0, T=5, B=3)])
    writer.flush()
    view = zreplay.open(url, storage_options=s3)
    req = Requests(_backend(url, s3), monkeypatch)
    rng = np.random.default_rng(1)
    index_gets = 0
    for t in range(1, 21):
        writer.add([builders.full(t, T=5, B=3 if t % 3 else 2)])
        writer.flush()
        assert view.refresh()
        n = view.num_rows
        pos = np.concatenate([rng.choice(n, 20), np.arange(n - 10, n)])
        req.reset()
        codes = check_rows(view.rows(pos))
        assert codes.max() // 10000 == t  # the newest trajectory is among them
        assert req.calls["get"] <= 2 * len(view.keys()), req.calls  # no retry round
        index_gets += req.gets["suffix"]
    writer.close()
    # Without a cache every read fetches the index of every touched shard again: 30 rows
    # touch several image, action and state shards each time (> 5 index GETs a read).
    assert index_gets < 20 * 5, index_gets


@pytest.mark.slow  # a multi-process soak: python -m pytest -m slow
def test_s3_reader_samples_newest_rows_while_a_writer_commits(url, s3):
    """A writer commits as fast as it can while a view refreshes and reads the newest rows:
    shards (and chunks still filling up) are replaced between a reader's index GET and
    its chunk GETs, which the reader must take for a race, never for damage."""
    writer = builders.writer(url, storage_options=s3, layout=LAYOUT)
    writer.add([builders.full(0, T=5, B=3)])
    writer.flush()
    done = threading.Event()

    def write():
        for t in range(1, 40):
            writer.add([builders.full(t, T=5, B=3)])
            writer.flush()
        done.set()

    th = threading.Thread(target=write)
    th.start()
    view = zreplay.open(url, storage_options=s3)
    reads = 0
    while not done.is_set() or reads < 5:
        view.refresh()
        n = view.num_rows
        check_rows(view.rows(np.arange(max(0, n - 20), n)))
        reads += 1
    th.join()
    writer.close()
    assert reads >= 5


def test_s3_writer_puts_whole_shards_and_reads_nothing(url, s3, monkeypatch):
    writer = builders.writer(url, storage_options=s3, layout=LAYOUT)
    writer.add([builders.full(0, T=5, B=3)])
    writer.flush()
    req = Requests(_backend(url, s3), monkeypatch)
    writer.add([builders.full(1, T=5, B=3)])  # rows 15..29
    writer.flush()
    assert set(req.calls) == {"put"}, req.calls  # no GET, HEAD or LIST
    data = [k.split("/data/", 1)[1] for k in req.put_keys if "/data/" in k]
    assert len(data) == len(set(data)), data  # each shard object once
    images = sorted(k for k in data if k.startswith("curr_obs/main_images/c."))
    assert images == ["curr_obs/main_images/c.0.0.0.0", "curr_obs/main_images/c.1.0.0.0"]
    assert len([k for k in data if "/c." in k]) == len(writer.keys) + 1
    # the commit record is published after every row and index object; only the segment
    # group's live_rows attribute (for plain-zarr readers) may follow it
    last = max(i for i, k in enumerate(req.put_keys) if k.endswith("zreplay/commit.json"))
    assert all(k.endswith("segments/default/zarr.json") for k in req.put_keys[last + 1 :])
    assert all(i < last for i, k in enumerate(req.put_keys) if "/data/" in k)
    writer.close()


def test_s3_failed_shard_upload_keeps_the_last_commit_and_retries(url, s3, monkeypatch):
    from zreplay.errors import WriteFailedError

    writer = builders.writer(url, storage_options=s3, layout=LAYOUT)
    writer.add([builders.full(0, T=5, B=3)])
    writer.flush()
    req = Requests(_backend(url, s3), monkeypatch)
    req.fail_put = lambda key: "main_images/c.1." in key  # the second image shard
    writer.add([builders.full(1, T=5, B=3), builders.full(2, T=5, B=3)])
    with pytest.raises(WriteFailedError, match="No space left"):
        writer.flush()
    view = zreplay.open(url, storage_options=s3)
    assert view.num_trajectories == 1  # the failed commit is not visible
    req.fail_put = None
    writer.flush()  # retried: rows are re-encoded from the last commit on
    writer.close()
    view.refresh()
    assert view.num_trajectories == 3
    for t in range(3):
        traj_equal(view.trajectory(t), make_traj(t, T=5, B=3))
    assert zreplay.verify(url, storage_options=s3).ok


def test_plain_zarr_reads_what_the_s3_writer_wrote(url, s3, tmp_path):
    import zarr

    view, local = _twin(url, s3, tmp_path, 7)
    n = view.num_rows
    seg = zarr.open_group(url, mode="r", storage_options=s3)["segments/default"]
    want = zarr.open_group(str(tmp_path / "local"), mode="r")["segments/default"]
    for key in view.keys():
        np.testing.assert_array_equal(seg[f"data/{key}"][:n], want[f"data/{key}"][:n], key)
    assert seg["data/curr_obs/main_images"].shards == (16, 8, 8, 3)
    np.testing.assert_array_equal(seg["offsets"][:8], want["offsets"][:8])


def test_s3_reader_survives_eviction_and_reclaimed_shards(url, s3):
    writer = builders.writer(url, storage_options=s3, layout=LAYOUT, capacity=60)
    writer.add([builders.full(t, T=5, B=3) for t in range(4)])
    writer.flush()
    # No column cache: it would serve these small rows of the old snapshot from RAM and
    # never meet the deleted shards this test is about.
    view = zreplay.open(url, storage_options=s3, column_cache_bytes=0)
    check_rows(view.rows(np.arange(view.num_rows)))  # every index cached
    for t in range(4, 12):  # the oldest shards are evicted and deleted meanwhile
        writer.add([builders.full(t, T=5, B=3)])
        writer.flush()
    # The view still has its old snapshot: rows whose shards are gone are drawn again
    # from a refreshed one, so the sample holds only rows that still exist.
    codes = check_rows(view.sample(64))
    assert codes.min() // 10000 >= 8
    view.refresh()
    check_rows(view.rows(np.arange(view.num_rows)))
    writer.close()


def test_s3_damage_names_segment_key_and_rows_even_with_a_cached_index(url, s3):
    import s3fs

    writer = builders.writer(url, storage_options=s3, layout=LAYOUT)
    writer.add([builders.full(t, T=5, B=3) for t in range(3)])
    writer.close()
    # No column cache, no chunk cache: these images would be served from them once read.
    view = zreplay.open(url, storage_options=s3, column_cache_bytes=0, chunk_cache_bytes=0)
    check_rows(view.rows(np.arange(16)))  # shard 0 of the images: index cached
    fs = s3fs.S3FileSystem(**s3)
    shard = url[len("s3://") :] + "/segments/default/data/curr_obs/main_images/c.0.0.0.0"
    raw = bytearray(fs.cat_file(shard))
    raw[5] ^= 0xFF  # inside chunk 0 (row 0)
    fs.pipe_file(shard, bytes(raw))
    with pytest.raises(CorruptBufferError, match=r"'default', key 'curr_obs/main_images', rows"):
        view.rows(np.array([0, 1]))
    check_rows(view.rows(np.arange(1, 16)))  # the other chunks of that shard are sound
    raw[-3] ^= 0xFF  # and the shard's index checksum
    fs.pipe_file(shard, bytes(raw))
    fresh = zreplay.open(url, storage_options=s3)
    with pytest.raises(CorruptBufferError, match="main_images"):
        fresh.rows(np.array([3]))
    assert not zreplay.verify(url, storage_options=s3).ok


def test_s3_forked_dataloader_workers_read_through_s3fs(url, s3):
    """obstore hangs in a process forked from one that used it: forked workers read the
    same way through s3fs (a hang shows as the loader's timeout)."""
    from torch.utils.data import DataLoader

    writer = builders.writer(url, storage_options=s3, layout=LAYOUT)
    writer.add([builders.full(t, T=5, B=3) for t in range(4)])
    writer.close()
    view = zreplay.open(url, storage_options=s3)
    check_rows(view.sample(32))  # obstore ran in this process before the fork
    loader = DataLoader(
        view, batch_size=16, num_workers=2, multiprocessing_context="fork", timeout=60
    )
    codes = np.sort(np.concatenate([check_rows(b) for b in loader]))
    assert len(codes) == view.num_rows == 60
    assert len(np.unique(codes)) == 60
    check_rows(view.sample(32))  # and this process goes on with obstore


def _open_and_sample(url: str, options: dict | None) -> int:
    view = zreplay.open(url, storage_options=options)
    return len(check_rows(view.sample(16)))


@pytest.mark.parametrize("how", ["client_kwargs", "anon", "environment", "profile"])
def test_s3_credentials_and_endpoints(url, s3, tmp_path, how):
    import os
    import subprocess
    import sys

    writer = builders.writer(url, storage_options=s3)
    builders.add_full(writer, [0])
    writer.close()
    if how == "client_kwargs":  # s3fs's nested spelling of endpoint and region
        opts = {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": s3["endpoint_url"], "region_name": "eu-west-1"},
        }
        assert _open_and_sample(url, opts) == 16
        return
    if how == "anon":  # unsigned requests to a bucket whose policy lets anyone read
        import json

        import s3fs

        from zreplay.store.objectio import ObstoreClient, obstore_settings

        fs, bucket = s3fs.S3FileSystem(**s3), f"zreplay-public-{uuid.uuid4().hex[:6]}"
        fs.mkdir(bucket)
        anyone = {"Effect": "Allow", "Principal": "*", "Action": ["s3:GetObject", "s3:ListBucket"]}
        anyone["Resource"] = [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]
        policy = json.dumps({"Version": "2012-10-17", "Statement": [anyone]})
        fs.call_s3("put_bucket_policy", Bucket=bucket, Policy=policy)
        fs.pipe_file(f"{bucket}/a/b", b"public bytes")
        opts = {"endpoint_url": s3["endpoint_url"], "anon": True}
        config, _, provider = obstore_settings(opts)
        assert config["skip_signature"] and provider is None and "access_key_id" not in config
        client = ObstoreClient(bucket, opts)
        assert bytes(client.get([("a/b", (-5, None))])[0]) == b"bytes"
        assert client.list("a/", recursive=True)[0] == [("a/b", 12)]
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=s3["endpoint_url"], AWS_EC2_METADATA_DISABLED="true")
    if how == "environment":
        env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    else:  # a shared credentials file, read through botocore's chain
        creds = tmp_path / "credentials"
        creds.write_text("[ci]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
        env.update(AWS_SHARED_CREDENTIALS_FILE=str(creds), AWS_PROFILE="ci")
        env.update(AWS_CONFIG_FILE=str(tmp_path / "none"))
    code = (
        "import sys, zreplay, numpy as np\n"
        f"v = zreplay.open({url!r})\n"
        "b = v.sample(16)\n"
        "assert (b['actions'][:, 0] == b['rewards'][:, 0]).all()\n"
        "print(len(b['actions']))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.split()[-1] == "16", out.stderr[-2000:]


def test_the_readme_s3_block_runs(s3):
    """README "Many writers, ranks, S3": the S3 block as printed, with moto's endpoint."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = readme.split("# S3 (tests/test_s3.py runs this block", 1)[1].split("```", 1)[0]
    lines = block.splitlines()[1:]
    (at,) = [i for i, line in enumerate(lines) if line.startswith("opts = {")]
    lines[at] = f"opts = {s3!r}"  # moto's endpoint and keys
    prefix = f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}/"
    code = "\n".join(lines).replace("s3://bucket/", prefix)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["batch"]["actions"].shape == (256, 7)
    assert zreplay.open(prefix + "ckpt/step_1000", storage_options=s3).num_trajectories == 3


def test_torchrl_storage_in_a_bucket(url, s3):
    """zreplay.torchrl.ZarrStorage on s3:// resumes and checkpoints like a local one."""
    pytest.importorskip("torchrl")
    import torch
    from tensordict import TensorDict
    from torchrl.data import TensorDictReplayBuffer

    from zreplay.torchrl import ZarrStorage

    def rb(path):
        return TensorDictReplayBuffer(
            storage=ZarrStorage(8, path=path, storage_options=s3), batch_size=4
        )

    first = rb(url)
    first.extend(TensorDict({"obs": torch.arange(10.0).view(-1, 1)}, [10]))
    first.storage.close()
    again = rb(url)
    assert again.storage[:]["obs"].flatten().tolist() == [8, 9, 2, 3, 4, 5, 6, 7]
    again.extend(TensorDict({"obs": torch.tensor([[10.0]])}, [1]))
    ckpt = url + "-ckpt"
    again.storage.dumps(ckpt)
    assert again.sample()["obs"].shape == (4, 1)
    again.storage.close()
    loaded = rb(url + "-loaded")
    loaded.storage.loads(ckpt)
    assert loaded.storage[:]["obs"].flatten().tolist() == [8, 9, 10, 3, 4, 5, 6, 7]
    assert len(loaded) == 8
    loaded.extend(TensorDict({"obs": torch.tensor([[11.0]])}, [1]))  # the writer follows
    assert loaded.storage[:]["obs"].flatten().tolist() == [8, 9, 10, 11, 4, 5, 6, 7]
    loaded.storage.close()


def test_chunks_kept_beside_a_read_never_push_out_chunks_read():
    """A small chunk budget: the encoded extras a request brought back are the first to
    go, so they never evict the decoded chunks a view reads again."""
    from zreplay.store.objectarray import SegmentCache

    cache = SegmentCache(chunk_bytes=3 * 800)
    cache.seen(1000, 0, True)
    read = [np.full(100, i, np.float64) for i in range(2)]  # 800 bytes each
    cache.put_chunks("a", np.array([0, 1]), read, 10)
    cache.put_encoded("a", np.arange(2, 6), [bytes(800)] * 4, 10)  # 3200 bytes beside
    held = cache.chunks("a", np.arange(6))
    assert all(isinstance(b, np.ndarray) for b in held[:2]), held
    assert sum(b is not None for b in held[2:]) == 1  # what fits of the extras


# -- what a new user sees when the bucket or the credentials are not there ---------------


def _aws_env(s3: dict, **more: str) -> dict:
    """This process's environment without AWS_* settings (and no ~/.aws, no instance
    metadata), pointed at moto's endpoint, plus ``more``."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=s3["endpoint_url"], AWS_EC2_METADATA_DISABLED="true")
    env.update(AWS_SHARED_CREDENTIALS_FILE="/nonexistent", AWS_CONFIG_FILE="/nonexistent")
    return {**env, **more}


def test_s3_a_bucket_that_does_not_exist_says_so(s3):
    """Not "Generic S3 error ... 404 Not Found <?xml ...>" under a chained traceback: the
    bucket's name and what to do, for a writer, a reader and the command line."""
    import subprocess
    import sys

    from zreplay.errors import NoSuchBucketError

    bucket = f"zreplay-absent-{uuid.uuid4().hex[:6]}"
    url = f"s3://{bucket}/run/buf"
    for make in (
        lambda: zreplay.TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=url, storage_options=s3
        ),
        lambda: zreplay.open(url, storage_options=s3),
    ):
        with pytest.raises(NoSuchBucketError) as got:
            make()
        text = str(got.value)
        assert text.startswith(f"no such bucket {bucket!r}: create it first"), text
        assert "<?xml" not in text and "\n" not in text
        assert got.value.__cause__ is None and got.value.__suppress_context__
        assert isinstance(got.value, OSError) and not isinstance(got.value, FileNotFoundError)
    env = _aws_env(s3, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    out = subprocess.run(
        [sys.executable, "-m", "zreplay.cli", "info", url], env=env, capture_output=True, text=True
    )
    assert out.returncode == 1 and out.stderr.strip() == (
        f"zreplay info: error: {NoSuchBucketError(bucket)}"
    ), out.stderr


def test_s3_missing_credentials_are_one_error_not_a_chain(url, s3):
    """The message saying where credentials come from is the error the user sees: one
    traceback, no chained obstore/botocore ones above it."""
    import subprocess
    import sys

    code = f"import zreplay\nzreplay.open({url!r})\n"
    out = subprocess.run(
        [sys.executable, "-c", code], env=_aws_env(s3), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 1
    assert out.stderr.count("Traceback (most recent call last)") == 1, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("PermissionError: [Errno 13] no AWS credentials found: pass"), last
