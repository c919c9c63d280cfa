"""save_checkpoint / load_checkpoint: consistency, hard links, rank sharding, RNG state."""

from __future__ import annotations

import os
import tarfile
import time

import builders
import numpy as np
import pytest
import zarr
from conftest import check_rows, codes_of, make_traj, shard_files, tree_state
from test_all_or_nothing import assert_exactly
from test_all_or_nothing import persistent as unwindowed
from test_plain_zarr import DATA, _nested_and_flat, _plain_rows, _shards_below

import zreplay
from zreplay.core.ranks import rank_block
from zreplay.errors import SchemaError
from zreplay.store.commit import read_commit


def persistent(path, **kw):
    return zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path), **kw)


def test_checkpoint_includes_pending_writes_and_is_frozen(tmp_path):
    core = builders.writer(tmp_path / "live", seed=3)
    for tid in range(5):
        builders.add(core, tid)  # no flush: the checkpoint must wait for them
    core.engine.checkpoint(str(tmp_path / "ck"))
    for tid in range(5, 9):
        builders.add(core, tid)
    core.flush()
    view = builders.reader(tmp_path / "ck")
    assert view.num_trajectories == 5
    for i in range(5):
        rec = view.trajectory(i)
        assert rec.trajectory_id == i
        np.testing.assert_array_equal(rec.columns["obs"], builders.trajectory(i).columns["obs"])
    assert set(builders.tids(view.sample(300)["obs"])) == set(range(5))
    view.close()
    core.close()


def test_checkpoint_hard_links_data_files(tmp_path):
    core = builders.writer(tmp_path / "live")
    for tid in range(4):
        builders.add(core, tid)
    core.engine.checkpoint(str(tmp_path / "ck"))
    core.close()
    data = tmp_path / "ck" / "segments" / "default" / "data"
    files = [os.path.join(r, f) for r, _, fs in os.walk(data) for f in fs if f != "zarr.json"]
    assert files and all(os.stat(f).st_nlink >= 2 for f in files)


def test_checkpoint_overwrites_an_older_checkpoint(tmp_path):
    core = builders.writer(tmp_path / "live")
    builders.add(core, 0)
    core.engine.checkpoint(str(tmp_path / "ck"))
    builders.add(core, 1)
    core.engine.checkpoint(str(tmp_path / "ck"))
    core.close()
    view = builders.reader(tmp_path / "ck")
    assert view.num_trajectories == 2
    view.close()


def test_load_checkpoint_restores_counters_data_and_random_stream(tmp_path):
    with persistent(tmp_path / "a", seed=11) as buf:
        buf.add_trajectories([make_traj(i, epochs=2) for i in range(6)])
        buf.sample(7)
        buf.save_checkpoint(str(tmp_path / "ck"))
        want = [codes_of(buf.sample(32)) for _ in range(3)]
        want_len, want_total = len(buf), buf.total_samples
    with persistent(tmp_path / "b", seed=99) as other:
        other.add_trajectories([make_traj(50)])
        other.load_checkpoint(str(tmp_path / "ck"))
        assert len(other) == want_len and other.total_samples == want_total
        for w in want:
            assert np.array_equal(codes_of(other.sample(32)), w)
        assert other.add_trajectories([make_traj(6)]) == [6]  # ids stay unique
    # The loaded buffer persists on its own path and is independent of the checkpoint.
    with persistent(tmp_path / "b") as again:
        assert len(again) == 7
    assert zreplay.open(tmp_path / "ck").num_trajectories == 6


def test_load_any_buffer_directory_with_other_schema(tmp_path):
    with persistent(tmp_path / "src") as src:
        src.add_trajectories([{"obs": np.full((4, 2, 3), i, np.float32)} for i in range(3)])
    with persistent(tmp_path / "dst") as dst:
        dst.add_trajectories([make_traj(0)])
        dst.load_checkpoint(str(tmp_path / "src"))
        assert len(dst) == 3 and dst.schema.keys == ["obs"]
        assert set(dst.sample(100)["obs"][:, 0].tolist()) == {0.0, 1.0, 2.0}


@pytest.mark.parametrize("n,world", [(10, 3), (7, 7), (5, 1), (2, 4)])
def test_distributed_load_blocks_are_disjoint_and_cover(tmp_path, n, world):
    with persistent(tmp_path / "src") as src:
        src.add_trajectories([make_traj(i, T=2, B=1) for i in range(n)])
        src.save_checkpoint(str(tmp_path / "ck"))
    got = []
    for rank in range(world):
        with zreplay.TrajectoryReplayBuffer(seed=rank) as buf:
            buf.load_checkpoint(str(tmp_path / "ck"), True, rank, world)
            ids = [buf.trajectory(i)["trajectory_id"] for i in range(len(buf))]
            assert ids == list(range(*rank_block(n, rank, world)))
            assert buf.total_samples == 2 * len(ids)
            if ids:
                assert set(codes_of(buf.sample(200)) // 10000) == set(ids)
            got += ids
    assert sorted(got) == list(range(n))


def test_distributed_load_validates_rank(tmp_path):
    with persistent(tmp_path / "src") as src:
        src.add_trajectories([make_traj(0)])
    with zreplay.TrajectoryReplayBuffer() as buf, pytest.raises(ValueError, match="local_rank"):
        buf.load_checkpoint(str(tmp_path / "src"), True, 2, 2)


def test_rank_block_matches_rlinf_formula():
    for n in range(0, 30):
        for world in range(1, 8):
            blocks = [rank_block(n, r, world) for r in range(world)]
            assert blocks[0][0] == 0 and blocks[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:], strict=False))
            sizes = [b - a for a, b in blocks]
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_load_checkpoint_rejects_unknown_directory(tmp_path):
    (tmp_path / "x").mkdir()
    with zreplay.TrajectoryReplayBuffer() as buf, pytest.raises(zreplay.FormatError):
        buf.load_checkpoint(str(tmp_path / "x"))


def test_load_checkpoint_of_own_directory_is_a_no_op(tmp_path):
    with persistent(tmp_path / "own") as buf:
        buf.add_trajectories([make_traj(i) for i in range(3)])
        buf.load_checkpoint(str(tmp_path / "own"))
        assert len(buf) == 3
        check_rows(buf.sample(50))
        with pytest.raises(ValueError, match="own directory"):
            buf.load_checkpoint(str(tmp_path / "own"), True, 0, 2)


def _rows(v, dtype=np.float32, shape=(3,), T=10, B=2):
    return {"obs": np.full((T, B, *shape), v, dtype)}


def test_a_view_follows_a_load_of_another_schema_or_layout(tmp_path):
    """Loading a checkpoint whose dtype, row shape or layout differs (legal: the buffer
    has one writer) leaves views that followed the old contents reading the new ones
    after a refresh, and the root recording the layout the arrays now have."""
    path = tmp_path / "b"
    w = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path))
    for i in range(1, 30):
        w.add_trajectories([_rows(i)])
        w.flush()
    view = zreplay.open(path, column_cache_bytes=0)
    view.sample(16)
    for name, kw, layout in [
        ("other_dtype", {"dtype": np.float64, "shape": (5,), "T": 30, "B": 4}, None),
        ("other_layout", {"T": 7}, {"obs": {"chunk_rows": 8, "shard_rows": 32}}),
    ]:
        ckpt = tmp_path / name
        extra = {"layout": layout} if layout else {}
        with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(ckpt), **extra) as c:
            for i in range(500, 520):
                c.add_trajectories([_rows(i, **kw)])
        w.load_checkpoint(str(ckpt))
        view.refresh()
        got = view.rows(np.arange(view.num_rows))["obs"]
        want = np.concatenate(
            [
                _rows(i, **kw)["obs"].swapaxes(0, 1).reshape(-1, *got.shape[1:])
                for i in range(500, 520)
            ]
        )
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype
        assert zreplay.verify(path).ok, str(zreplay.verify(path))
    w.close()


def test_a_refresh_that_read_the_schema_before_a_load_of_another_starts_over(tmp_path):
    """A refresh reads the root's schema, then each segment's commit: a load of another
    dtype landing in between pairs the old schema with the new arrays, which is no damage
    but a refresh to start over (the race an adversarial pass hit 2 times in 49k reads)."""
    from zreplay.store.root import BufferRoot

    path = tmp_path / "b"
    w = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path))
    w.add_trajectories([_rows(1)])
    w.flush()
    view = zreplay.open(path)
    view.sample(4)
    stale = BufferRoot(path).read_meta()  # what the refresh reads before the load lands
    ckpt = tmp_path / "ckpt"
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(ckpt)) as c:
        c.add_trajectories([_rows(7, dtype=np.int64, shape=(5,))])
    w.load_checkpoint(str(ckpt))
    real, calls = BufferRoot.read_meta, []

    def first_call_stale(self):
        calls.append(1)
        return stale if len(calls) == 1 else real(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(BufferRoot, "read_meta", first_call_stale)
        view.refresh()
    got = view.rows(np.arange(view.num_rows))["obs"]
    assert got.dtype == np.int64 and got.shape == (20, 5) and np.all(got == 7)
    w.close()


def test_ranks_that_share_a_path_each_load_their_block_whenever_they_opened(tmp_path):
    """Ranks open their writers on one path first (none has a schema yet), then load
    their blocks of one checkpoint one after another: each is let in (the schema and
    layout are those the first load recorded), and each segment holds its block."""
    with persistent(tmp_path / "src") as src:
        src.add_trajectories([make_traj(i) for i in range(6)])
        src.save_checkpoint(str(tmp_path / "ck"))
    ranks = [persistent(tmp_path / "shared", writer_id=str(r)) for r in range(3)]
    for r, buf in enumerate(ranks):
        buf.load_checkpoint(str(tmp_path / "ck"), is_distributed=True, local_rank=r, world_size=3)
    got = [set(codes_of(b.sample(64)) // 10000) for b in ranks]
    assert got == [{0, 1}, {2, 3}, {4, 5}]
    ranks[1].add_trajectories([make_traj(9)])  # and they go on adding
    for b in ranks:
        b.close()
    assert zreplay.verify(tmp_path / "shared").ok


def test_a_writer_that_joined_without_layout_loads_in_the_recorded_one(tmp_path):
    """Rank 0 made the buffer with layout overrides; rank 1 joined without any, so
    its adds use the recorded layout, and so does a load that re-adds rows (an RLinf
    export): the other rank's segment stays as it is stored."""
    small = {"actions": {"chunk_rows": 4, "shard_rows": 16}}
    path = tmp_path / "shared"
    r0 = persistent(path, writer_id="0", layout=small)
    r0.add_trajectories([make_traj(i) for i in range(3)])
    r0.flush()
    with persistent(tmp_path / "src") as src:
        src.add_trajectories([make_traj(i) for i in range(10, 14)])
        src.export(str(tmp_path / "pt"), format="pt")
    r1 = persistent(path, writer_id="1")
    r1.add_trajectories([make_traj(20)])
    r1.load_checkpoint(str(tmp_path / "pt"))
    assert set(codes_of(r1.sample(64)) // 10000) == {10, 11, 12, 13}
    layout = zarr.open_group(path, mode="r").attrs["zreplay"]["layout"]
    assert layout["actions"]["shard_rows"] == 16
    r0.close(), r1.close()
    assert zreplay.verify(path).ok


def test_a_writer_opening_during_a_load_creates_its_arrays_in_the_loaded_layout(
    tmp_path, monkeypatch
):
    """Writer x is alone and loads a checkpoint in another layout; writer y opens and
    adds while x's swap is under way.  y waits for the swap (the root's schema guard)
    and creates its arrays in the layout x leaves: before, y's arrays kept the old one,
    the root recorded the new, and y's reclaim deleted live shards (rows read as zeros)."""
    import threading

    from zreplay.engine import replace

    small = {"actions": {"chunk_rows": 4, "shard_rows": 16}}
    with persistent(tmp_path / "src", layout=small) as src:
        src.add_trajectories([make_traj(i) for i in range(4)])
        src.save_checkpoint(str(tmp_path / "ck"))
    path = tmp_path / "shared"
    x = persistent(path, writer_id="x", capacity=90)
    x.add_trajectories([make_traj(50)])
    x.flush()
    reached, go = threading.Event(), threading.Event()
    finish = replace.finish

    def slow_finish(*a, **kw):
        reached.set()
        assert go.wait(30)
        return finish(*a, **kw)

    monkeypatch.setattr(replace, "finish", slow_finish)
    loader = threading.Thread(target=x.load_checkpoint, args=(str(tmp_path / "ck"),))
    loader.start()
    assert reached.wait(30)
    ys = []

    def join():
        y = persistent(path, writer_id="y", capacity=90)
        y.add_trajectories([make_traj(60 + k) for k in range(2)])
        ys.append(y)

    joiner = threading.Thread(target=join)
    joiner.start()
    joiner.join(1.0)
    assert joiner.is_alive()  # waiting for the swap
    go.set()
    loader.join(30), joiner.join(30)
    monkeypatch.setattr(replace, "finish", finish)
    (y,) = ys
    for k in range(8):  # past capacity: y evicts and reclaims in 16-row shards
        y.add_trajectories([make_traj(70 + k)])
    y.flush()
    check_rows(y.sample(128))
    assert set(codes_of(x.sample(64)) // 10000) == {0, 1, 2, 3}
    x.close(), y.close()
    check_rows(zreplay.open(path).sample(256))
    assert zreplay.verify(path).ok


def test_a_checkpoint_whose_shards_are_not_where_its_arrays_say_is_refused(tmp_path):
    """An array's zarr.json naming its shards in the other form than its files: the
    load is refused before anything changes (before, it was adopted and failed to
    sample)."""
    import json

    with persistent(tmp_path / "src") as src:
        src.add_trajectories([make_traj(i) for i in range(4)])
        src.save_checkpoint(str(tmp_path / "ck"))
    meta = tmp_path / "ck" / "segments" / "default" / "data" / "rewards" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["chunk_key_encoding"] = {"name": "default", "configuration": {"separator": "/"}}
    meta.write_text(json.dumps(doc))
    with persistent(tmp_path / "buf") as buf:
        buf.add_trajectories([make_traj(40)])
        with pytest.raises(zreplay.CorruptBufferError, match="the checkpoint is damaged"):
            buf.load_checkpoint(str(tmp_path / "ck"))
        assert set(codes_of(buf.sample(32)) // 10000) == {40}


def test_checkpoint_links_files_and_makes_no_empty_directories(stored, tmp_path):
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path / "a")) as b:
        b.load_checkpoint(str(stored))
        b.save_checkpoint(str(tmp_path / "ck"))
    for r, dirs, files in os.walk(tmp_path / "ck"):
        assert files or dirs, f"empty directory {r}"
    a, ck = shard_files(tmp_path / "a", "rewards")[0], shard_files(tmp_path / "ck", "rewards")[0]
    assert os.stat(a).st_ino == os.stat(ck).st_ino  # a hard link, not a copy


def test_load_checkpoint_refills_the_ram_tier_in_the_background(stored, tmp_path):
    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path / "b"))
    buf.load_checkpoint(str(stored))
    check_rows(buf.sample(256))  # correct whether rows come from RAM or disk yet
    deadline = time.time() + 30
    while buf.get_stats()["cache_size"] < 5 and time.time() < deadline:
        time.sleep(0.01)
    st = buf.get_stats()
    assert st["cache_size"] == 5 and st["rows_in_ram"] == 5 * 18
    buf.add_trajectories([make_traj(50)])
    check_rows(buf.sample(256))
    buf.close()
    # closing while a refill runs stops it cleanly
    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path / "b"))
    buf.close()
    assert zreplay.verify(tmp_path / "b").ok


def test_a_checkpoint_loaded_beside_other_writers_leaves_their_segments_as_they_are(tmp_path):
    """Writer a loads a checkpoint of a format-4 segment (nested chunk keys, the same
    layout), writer b the two-segment format-4 buffer (re-added in the buffer's own
    arrays): the root's layout stays, writer d's flat segment is untouched, and every
    segment evicts and reclaims its own shard files."""
    with tarfile.open(DATA / "format4-buffer.tar.gz") as t:
        t.extractall(tmp_path, filter="data")
    zreplay.upgrade(tmp_path / "fmt4")
    with zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(tmp_path / "fmt4"), writer_id="a"
    ) as old:
        old.save_checkpoint(str(tmp_path / "ck_a"))
    small = {"chunk_rows": 4, "shard_rows": 16}
    lay = {k: small for k in ("curr_obs/main_images", "actions", "rewards")}
    path = tmp_path / "buf"
    bufs = {
        w: zreplay.TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=str(path), writer_id=w, capacity=90, layout=lay
        )
        for w in "abd"
    }
    for i, buf in enumerate(bufs.values()):
        buf.add_trajectories([make_traj(10 * i + k) for k in range(3)])
        buf.flush()
    layout = zarr.open_group(path, mode="r").attrs["zreplay"]["layout"]
    bufs["a"].load_checkpoint(str(tmp_path / "ck_a"))
    bufs["b"].load_checkpoint(str(tmp_path / "fmt4"))
    assert zarr.open_group(path, mode="r").attrs["zreplay"]["layout"] == layout
    assert set(codes_of(bufs["a"].sample(256)) // 10000) == {3, 4, 5, 6, 7}
    assert _nested_and_flat(path / "segments" / "a")[1] == []
    assert _nested_and_flat(path / "segments" / "d")[0] == []
    for k in range(8):
        for i, buf in enumerate(bufs.values()):
            buf.add_trajectories([make_traj(300 + 10 * i + k)])
    for w, buf in bufs.items():
        buf.flush()
        below = read_commit(path / "segments" / w).reclaimed_below
        assert below > 0 and _shards_below(path, w, below) == [], w
        check_rows(buf.sample(128))
        buf.close()
    assert zreplay.verify(path).ok


@pytest.mark.parametrize("change", ["layout", "schema"])
def test_a_checkpoint_in_another_layout_is_refused_beside_other_writers(tmp_path, change):
    """A checkpoint whose shard rows (or keys) differ cannot replace one writer's segment
    while another's is stored in the recorded layout (its reclaim would delete the wrong
    rows) and schema: SchemaError, nothing changed."""
    src = tmp_path / "src"
    small = {"actions": {"chunk_rows": 4, "shard_rows": 16}} if change == "layout" else None
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(src), layout=small) as b:
        trajs = [make_traj(k, as_dict=True) for k in range(4)]
        if change == "schema":
            trajs = [{**t, "extra": t["rewards"]} for t in trajs]
        b.add_trajectories(trajs)
        b.save_checkpoint(str(tmp_path / "ck"))
    path = tmp_path / "buf"
    a, b = (
        zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path), writer_id=w)
        for w in "ab"
    )
    a.add_trajectories([make_traj(50)]), b.add_trajectories([make_traj(60)])
    a.flush(), b.flush()
    before = tree_state(path, skip=path / "segments" / "a")
    commit = read_commit(path / "segments" / "a")
    with pytest.raises(SchemaError, match="another layout" if change == "layout" else "schema"):
        a.load_checkpoint(str(tmp_path / "ck"))
    assert tree_state(path, skip=path / "segments" / "a") == before  # root, b: untouched
    after = read_commit(path / "segments" / "a")
    assert (after.contents, after.n_rows, after.n_traj) == (
        commit.contents,
        commit.n_rows,
        commit.n_traj,
    )
    assert set(codes_of(a.sample(64)) // 10000) == {50}
    a.close(), b.close()
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path / "own")) as c:
        c.load_checkpoint(str(tmp_path / "ck"))  # a buffer of its own takes it
        assert set(codes_of(c.sample(64)) // 10000) == {0, 1, 2, 3}


def test_a_checkpoint_keeps_its_own_lengths_while_the_buffer_grows(tmp_path):
    """A checkpoint shares the buffer's files by hard links; rewriting the buffer's
    zarr.json at each commit never changes the checkpoint's."""
    path, ckpt = tmp_path / "b", tmp_path / "ckpt"
    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path))
    buf.add_trajectories([make_traj(i) for i in range(2)])
    buf.save_checkpoint(str(ckpt))
    buf.add_trajectories([make_traj(i) for i in range(2, 5)])
    buf.close()
    saved, live = _plain_rows(ckpt)
    assert {v.shape[0] for v in saved.values()} == {36} and live == [0, 36]
    assert {v.shape[0] for v in _plain_rows(path)[0].values()} == {90}


def _rlinf_dir(tmp_path, tids, name="rl"):
    with unwindowed(tmp_path / f"{name}-src") as src:
        src.add_trajectories([make_traj(t) for t in tids])
        src.export(str(tmp_path / name), "pt")
    return tmp_path / name


@pytest.mark.parametrize("damage", ["truncated .pt file", "another schema mid-way"])
def test_a_failed_load_leaves_the_buffer_as_it_was(tmp_path, damage):
    rl = _rlinf_dir(tmp_path, [10, 11, 12])
    files = sorted(rl.glob("trajectory_*.pt"))
    if damage == "truncated .pt file":
        files[-1].write_bytes(files[-1].read_bytes()[:100])
        exc = zreplay.CorruptBufferError
    else:
        import torch

        torch.save({"other": torch.zeros(4, 2, 3)}, files[-1])
        exc = zreplay.SchemaError
    path = tmp_path / "b"
    with unwindowed(path) as buf:
        buf.add_trajectories([make_traj(0), make_traj(1)])
        with pytest.raises(exc):
            buf.load_checkpoint(str(rl))
        assert len(buf) == 2
        check_rows(buf.sample(256))
        assert buf.add_trajectories([make_traj(2)]) == [2]
    assert_exactly(path, [0, 1, 2])
    assert not (path / "segments" / "default" / "zreplay" / "staging").exists()


def test_a_distributed_load_into_a_small_buffer_respects_its_capacity(tmp_path):
    """Defect 10: len/total_samples exceeded capacity until the next add."""
    with unwindowed(tmp_path / "src") as src:
        src.add_trajectories([make_traj(t) for t in range(8)])  # 18 rows each
        src.save_checkpoint(str(tmp_path / "ckpt"))
    with unwindowed(tmp_path / "b", capacity=40) as buf:
        buf.load_checkpoint(str(tmp_path / "ckpt"), is_distributed=True, local_rank=0, world_size=2)
        assert buf.total_samples <= 40 and len(buf) == 2
        ids = [buf.trajectory(i)["trajectory_id"] for i in range(len(buf))]
        assert ids == [2, 3]  # rank 0's block is 0..3; the newest whole ones are kept
        check_rows(buf.sample(64))
    with unwindowed(tmp_path / "b", capacity=40) as buf:
        assert buf.total_samples <= 40 and len(buf) == 2
