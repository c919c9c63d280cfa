"""zreplay.ReplayBuffer against stable-worldmodel's ReplayBuffer edge cases, plus
persistence, dumps and DataLoader workers."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import zreplay
from zreplay.errors import SchemaError


def episode(L, base=0, adim=2):
    """Columns whose values encode (base, step): pixels[t] = base + t."""
    t = np.arange(L)
    return {
        "pixels": (base + t).astype(np.int64)[:, None, None] * np.ones((1, 2, 2), np.int64),
        "action": ((base + t)[:, None] * 10 + np.arange(adim)).astype(np.float32),
        "reward": np.full(L, 0.5, np.float32),
        "terminated": t == L - 1,
    }


def fill(rb, lengths):
    for i, L in enumerate(lengths):
        rb.write_episode(episode(L, base=1000 * (i + 1)))


@pytest.fixture
def rb(tmp_path):
    b = zreplay.ReplayBuffer(100, path=tmp_path / "rb", seed=0)
    yield b
    b.close()


def test_empty_and_zero_length_episodes_are_no_ops(rb):
    rb.write_episode({})
    rb.write_episode({"pixels": np.zeros((0, 2, 2)), "action": np.zeros((0, 2))})
    rb.write_episode({"pixels": []})
    assert rb.num_episodes == 0 and rb.column_names == [] and len(rb) == 0
    with pytest.raises(IndexError, match="empty"):
        rb[0]
    with pytest.raises(RuntimeError, match="no clips of history_len=1"):
        rb.sample(4)


def test_key_filter_can_make_a_no_op(tmp_path):
    b = zreplay.ReplayBuffer(10, key_filter=zreplay.classic_filter)
    b.write_episode({"state": np.zeros(3)})
    assert b.num_episodes == 0
    b.write_episode({"pixels": np.zeros((3, 2)), "state": np.zeros(3)})
    assert b.column_names == ["pixels"]
    b.close()


def test_rejections_raise_value_errors_before_writing(rb):
    with pytest.raises(ValueError, match="'reward' is scalar; expected a per-step array"):
        rb.write_episode({"reward": np.float32(1.0)})
    with pytest.raises(ValueError, match="has length 3, expected 4"):
        rb.write_episode({"a": np.zeros(4), "b": np.zeros(3)})
    with pytest.raises(ValueError, match="episode length 101 exceeds max_steps=100"):
        rb.write_episode(episode(101))
    fill(rb, [5])
    with pytest.raises(ValueError, match=r"schema mismatch. missing=\['reward'\], extra=\[\]"):
        rb.write_episode({k: v for k, v in episode(3).items() if k != "reward"})
    with pytest.raises(ValueError, match=r"missing=\[\], extra=\['x'\]"):
        rb.write_episode({**episode(3), "x": np.zeros(3)})
    with pytest.raises(ValueError, match=r"'action' per-step shape \(3,\) mismatches expected"):
        rb.write_episode(episode(3, adim=3))
    bad = episode(3)
    bad["reward"] = bad["reward"].astype(np.float64)
    with pytest.raises(SchemaError, match="'reward' dtype float64 mismatches expected float32"):
        rb.write_episode(bad)
    assert rb.num_episodes == 1 and rb.num_steps_stored == 5


def test_lists_of_per_step_arrays_and_tensors_are_accepted(rb):
    ep = episode(4)
    rb.write_episode({k: [torch.as_tensor(x) for x in v] for k, v in ep.items()})
    got = next(rb.episodes())
    assert isinstance(got["pixels"], list) and len(got["pixels"]) == 4
    for k in ep:
        assert np.array_equal(np.stack(got[k]), ep[k])


def test_clips_never_cross_episodes_and_counts_follow_the_span(rb):
    fill(rb, [10, 3, 7])
    assert rb.num_valid_ends(1) == 20 and rb.num_valid_ends(4) == 7 + 0 + 4
    b = rb.sample(256, history_len=4)
    pix = b["pixels"][:, :, 0, 0]
    assert pix.shape == (256, 4)
    assert np.all(np.diff(pix, axis=1) == 1) and np.all(pix // 1000 == pix[:, :1] // 1000)
    assert not np.any(pix // 1000 == 2)  # the 3-step episode is too short


def test_frameskip_strides_observations_and_keeps_actions_dense(tmp_path):
    b = zreplay.ReplayBuffer(100, history_len=4, frameskip=2)
    b.write_episode(episode(10, base=1000))
    assert len(b) == 3  # length 10, span 8
    clip = b[1]
    assert list(clip["pixels"][:, 0, 0]) == [1001, 1003, 1005, 1007]
    assert clip["action"].shape == (4, 4)  # (history_len, frameskip * action_dim)
    want = np.array(
        [[(1001 + s) * 10 + a for s in (2 * i, 2 * i + 1) for a in (0, 1)] for i in range(4)],
        np.float32,
    )
    assert np.array_equal(clip["action"], want)
    assert list(clip["reward"]) == [0.5] * 4
    b.close()


def test_padding_uses_short_episodes_and_marks_pads(tmp_path):
    b = zreplay.ReplayBuffer(100, history_len=3, pad="repeat")
    b.write_episode(episode(2, base=1000))
    assert len(b) == 2
    assert list(b[0]["pixels"][:, 0, 0]) == [1000, 1000, 1000]
    assert list(b[0]["is_pad"]) == [True, True, False]
    assert list(b[1]["pixels"][:, 0, 0]) == [1000, 1000, 1001]
    z = zreplay.ReplayBuffer(100, history_len=3, pad="zero")
    z.write_episode(episode(2, base=1000))
    assert list(z[-1]["pixels"][:, 0, 0]) == [0, 1000, 1001]
    b.close(), z.close()


def test_sampler_hook_shape_range_and_step_counter(rb):
    fill(rb, [10, 10])
    calls = []

    def sampler(step, buf, batch, h):
        calls.append((step, batch, h))
        return np.arange(batch) % buf.num_valid_ends(h)

    rb.sampler = sampler
    rb.sample(3)
    rb.sample(3, history_len=2)
    rb.sample(3, step=100)  # explicit step: passed through, counter unchanged
    rb.sample(3)
    assert calls == [(0, 3, 1), (1, 3, 2), (100, 3, 1), (2, 3, 1)]
    rb.sampler = lambda step, buf, batch, h: np.zeros((batch, 1), np.int64)
    with pytest.raises(ValueError, match=r"returned shape \(3, 1\), expected \(3,\)"):
        rb.sample(3)
    rb.sampler = lambda step, buf, batch, h: np.full(batch, 10**6)
    with pytest.raises(IndexError, match=r"clip index out of range \[0, 20\)"):
        rb.sample(3)
    with pytest.raises(ValueError):
        rb.sample(0)
    with pytest.raises(ValueError):
        rb.sample(2, history_len=0)


def test_negative_and_out_of_range_indices(rb):
    fill(rb, [5])
    assert rb[-1]["pixels"][0, 0, 0] == 1004
    with pytest.raises(IndexError):
        rb[5]
    with pytest.raises(IndexError):
        rb[-6]


def test_transform_applies_to_getitem_only(tmp_path):
    b = zreplay.ReplayBuffer(50, transform=lambda c: {"px": c["pixels"] * 0})
    b.write_episode(episode(3))
    assert set(b[0]) == {"px"} and "pixels" in b.sample(1)
    b.close()


def test_reopen_resumes_episodes_step_counter_and_random_stream(tmp_path):
    path = tmp_path / "p"
    a = zreplay.ReplayBuffer(100, path=path, seed=5)
    fill(a, [10, 20])
    a.sample(4), a.sample(4)
    a.close()
    b = zreplay.ReplayBuffer(100, path=path, seed=5)
    assert list(b.lengths) == [10, 20] and b.step == 2
    nxt = b.sample(8)
    b.close()
    # the same continuation as an uninterrupted run
    c = zreplay.ReplayBuffer(100, path=tmp_path / "q", seed=5)
    fill(c, [10, 20])
    c.sample(4), c.sample(4)
    assert np.array_equal(c.sample(8)["pixels"], nxt["pixels"])
    c.close()


def test_dump_hdf5_round_trip_overwrite_append_error(rb, tmp_path):
    fill(rb, [6, 4])
    f = tmp_path / "d.h5"
    rb.dump(f)
    with h5py.File(f) as h:
        assert list(h["ep_len"][:]) == [6, 4] and list(h["ep_offset"][:]) == [0, 6]
        assert h["pixels"].compression == "gzip" and h["pixels"].chunks is not None
    rb.dump(f)  # overwrite is the default
    rb.dump(f, mode="append")
    with pytest.raises(FileExistsError):
        rb.dump(f, mode="error")
    eps = list(zreplay.iter_hdf5(f))
    assert [len(e["reward"]) for e in eps] == [6, 4, 6, 4]
    orig = [{k: np.stack(v) for k, v in e.items()} for e in rb.episodes()]
    for got, want in zip(eps, orig + orig, strict=True):
        for k in want:
            assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k])
    back = zreplay.load_hdf5(f, path=tmp_path / "back")
    assert list(back.lengths) == [6, 4, 6, 4]
    back.close()


def test_an_interrupted_hdf5_append_leaves_the_file_as_it_was(rb, tmp_path, monkeypatch):
    from zreplay.compat import hdf5

    fill(rb, [6, 4])
    f = tmp_path / "d.h5"
    rb.dump(f)
    h5_before = list(_h5_contents(f).items())
    calls = []
    append = hdf5._Column.append

    def interrupted(self, *a, **kw):  # Ctrl-C once some columns have grown
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return append(self, *a, **kw)

    monkeypatch.setattr(hdf5._Column, "append", interrupted)
    with pytest.raises(KeyboardInterrupt):
        rb.dump(f, mode="append")
    monkeypatch.undo()
    assert list(_h5_contents(f).items()) == h5_before
    rb.dump(f, mode="append")  # and the next append goes on from there
    assert [len(e["reward"]) for e in zreplay.iter_hdf5(f)] == [6, 4, 6, 4]


def _h5_contents(path) -> dict:
    with h5py.File(path) as h:
        out = {k: (h[k].shape, h[k][:].tobytes()) for k in h}
        out["attrs"] = dict(h.attrs)
    return out


def test_dump_zarr_round_trip_and_dump_after_clear_writes_nothing(rb, tmp_path):
    fill(rb, [6, 4])
    rb.dump(tmp_path / "z", format="zarr")
    v = zreplay.open(tmp_path / "z")
    assert v.num_episodes == 2
    assert np.array_equal(v.episode(1)["pixels"], np.stack(list(rb.episodes())[1]["pixels"]))
    rb.clear()
    rb.dump(tmp_path / "e.h5")
    assert list(zreplay.iter_hdf5(tmp_path / "e.h5")) == []
    with pytest.raises(ValueError, match="format"):
        rb.dump(tmp_path / "x", format="lance")


def _collect(loader):
    out = []
    for batch in loader:
        out.extend(batch["pixels"][:, :, 0, 0].tolist())
    return out


def test_dataloader_workers_cover_every_clip_once(tmp_path):
    b = zreplay.ReplayBuffer(500, history_len=3, path=tmp_path / "dl")
    fill(b, [10, 7, 2, 30])
    b.flush()
    loader = DataLoader(b, batch_size=8, shuffle=True, num_workers=2)
    clips = _collect(loader)
    assert len(clips) == len(b) == 8 + 5 + 0 + 28
    assert len({tuple(c) for c in clips}) == len(b)
    b.close()


def test_dataloader_workers_see_episodes_written_after_they_started(tmp_path):
    b = zreplay.ReplayBuffer(500, path=tmp_path / "dl2")
    fill(b, [5])
    b.flush()
    loader = DataLoader(b, batch_size=5, num_workers=1, persistent_workers=True)
    assert len(_collect(loader)) == 5
    b.write_episode(episode(5, base=7000))
    got = _collect(loader)  # same worker process, reopened store picks it up
    assert len(got) == 10 and any(c[0] >= 7000 for c in got)
    b.close()


def test_views_and_clip_datasets_in_spawned_workers(tmp_path):
    b = zreplay.ReplayBuffer(500, path=tmp_path / "sp")
    fill(b, [4, 6])
    b.flush()
    view = zreplay.open(tmp_path / "sp")
    ctx = mp.get_context("spawn")
    rows = DataLoader(view, batch_size=4, num_workers=2, multiprocessing_context=ctx)
    assert sorted(int(x) for bt in rows for x in bt["pixels"][:, 0, 0]) == sorted(
        [1000 + i for i in range(4)] + [2000 + i for i in range(6)]
    )
    ds = zreplay.ClipDataset(tmp_path / "sp", history_len=2)
    clips = DataLoader(ds, batch_size=3, num_workers=2, multiprocessing_context=ctx)
    assert len(_collect(clips)) == 3 + 5
    b.close()


def test_replay_dataset_mixes_demo_batches_and_prefetches(tmp_path):
    online = zreplay.ReplayBuffer(500, seed=1)
    demo = zreplay.ReplayBuffer(500, seed=2)
    fill(online, [20])
    demo.write_episode(episode(20, base=5000))
    ds = zreplay.ReplayDataset(online, batch_size=8, demo=demo, demo_ratio=0.25, prefetch=3)
    it = iter(DataLoader(ds, batch_size=None, num_workers=0))
    for _ in range(5):
        batch = next(it)
        pix = batch["pixels"][:, 0, 0, 0]
        assert pix.shape == (8,)
        assert (pix >= 5000).sum() == 2 and (pix < 5000).sum() == 6
    online.close(), demo.close()


def test_worker_replica_refuses_writes(tmp_path):
    import pickle

    b = zreplay.ReplayBuffer(50, path=tmp_path / "r")
    fill(b, [3])
    clone = pickle.loads(pickle.dumps(b))
    assert clone.path == b.path
    with pytest.raises(RuntimeError, match="read-only replica"):
        clone.write_episode(episode(3))
    assert clone._origin is None  # a replica, not the process that owns the writer
    b.close()


def test_clip_count_cache_is_lazy_reused_rekeyed_and_invalidated(rb):
    fill(rb, [10, 10])
    idx = rb.core.engine.state.index
    view = idx.episodes()
    assert view._cum == {}  # lazy: nothing counted before a clip is asked for
    assert rb.num_valid_ends(2) == 18 and len(view._cum) == 1
    cached = next(iter(view._cum.values()))
    assert rb.num_valid_ends(2) == 18 and next(iter(view._cum.values())) is cached  # reused
    assert rb.num_valid_ends(3) == 16 and len(view._cum) == 2  # re-keyed by span
    fill(rb, [5])  # write
    assert idx.episodes() is not view and rb.num_valid_ends(3) == 19
    view = idx.episodes()
    rb.write_episode(episode(90, base=9000))  # evicts
    assert idx.episodes() is not view and rb.num_valid_ends(3) == 3 + 88  # [5, 90] left
    view = rb.core.engine.state.index.episodes()
    rb.clear()
    assert rb.core.engine.state.index.episodes() is not view and rb.num_valid_ends(3) == 0


def test_state_dict_round_trips_the_sampler(rb):
    fill(rb, [10, 10])
    rb.sample(2)
    state = rb.state_dict()
    a = rb.sample(8)
    rb.load_state_dict(state)
    assert rb.step == 1 and np.array_equal(rb.sample(8)["pixels"], a["pixels"])


def test_nstep_keys_subset_keeps_the_stored_next_column():
    rb = zreplay.ReplayBuffer(100, seed=0)
    L = 4
    rb.write_episode(
        {
            "obs": np.arange(L, dtype=np.float32)[:, None],
            "next_obs": np.arange(1, L + 1, dtype=np.float32)[:, None],
            "reward": np.ones(L, np.float32),
            "truncated": np.arange(L) == L - 1,
        }
    )
    b = rb.sample_nstep(200, n=1, keys=["obs", "reward"])
    assert set(b) == {"obs", "reward", "next_obs", "return", "discount", "n_steps", "terminated_n"}
    assert 3 in b["obs"][:, 0]  # the truncated last step bootstraps from the stored next obs
    assert np.array_equal(b["next_obs"], b["obs"] + 1)
    rb.close()


def test_dataloader_workers_keep_the_first_episodes_column_order(tmp_path):
    """Workers returned batch keys sorted by name; the main process keeps the first
    episode's order (stable-worldmodel's), and the README promises it."""
    b = zreplay.ReplayBuffer(500, history_len=2, path=tmp_path / "order")
    ep = {
        "pixels": np.zeros((6, 4, 4, 3), np.uint8),
        "action": np.zeros((6, 2), np.float32),
        "reward": np.zeros(6, np.float32),
        "obs": {"state": np.zeros((6, 3), np.float32), "goal": np.zeros((6, 3), np.float32)},
    }
    b.write_episode(ep)
    b.flush()
    here = list(b[0]) + list(b[0]["obs"])
    assert here == ["pixels", "action", "reward", "obs", "state", "goal"]
    for ctx in ("fork", "spawn"):
        loader = DataLoader(b, batch_size=2, num_workers=1, multiprocessing_context=ctx)
        batch = next(iter(loader))
        assert list(batch) + list(batch["obs"]) == here, ctx
    b.close()


_DIE_MID_DUMP = """
import os, sys
import numpy as np
import zreplay
from zreplay.compat import hdf5
rb = zreplay.ReplayBuffer(500, path=sys.argv[1])
append = hdf5._Column.append
def dying(self, *a, **k):
    append(self, *a, **k)
    os._exit(9)  # killed midway through the dump
hdf5._Column.append = dying
rb.dump(sys.argv[2], format="hdf5")
"""


def test_a_dump_killed_midway_leaves_a_partial_file_the_next_dump_removes(tmp_path):
    b = zreplay.ReplayBuffer(500, path=tmp_path / "src")
    fill(b, [5, 6])
    b.close()
    out = tmp_path / "e.h5"
    got = subprocess.run([sys.executable, "-c", _DIE_MID_DUMP, str(tmp_path / "src"), str(out)])
    assert got.returncode == 9
    left = [n for n in os.listdir(tmp_path) if n.startswith(".e.h5.partial")]
    assert left and not out.exists()
    b = zreplay.ReplayBuffer(500, path=tmp_path / "src")
    b.dump(out, format="hdf5")
    b.close()
    assert [n for n in os.listdir(tmp_path) if n.startswith(".e.h5.")] == []
    assert len(list(zreplay.iter_hdf5(out))) == 2


def test_a_key_filter_returning_none_skips_the_episode():
    """stable-worldmodel's write_episode skips an episode whose filter returns None."""
    b = zreplay.ReplayBuffer(100, key_filter=lambda ep: ep if len(ep["r"]) > 2 else None)
    b.write_episode({"r": np.zeros(2)})
    b.write_episode({"r": np.zeros(5)})
    assert b.num_episodes == 1 and b.num_steps_stored == 5
    b.close()


def test_a_ragged_step_list_names_its_column():
    b = zreplay.ReplayBuffer(10)
    with pytest.raises(SchemaError, match="'obs'"):
        b.write_episode({"ok": np.zeros((2, 3)), "obs": [np.zeros(2), np.zeros(3)]})
    assert b.num_episodes == 0
    b.close()


def _three_columns(fill=0) -> dict:
    return {
        "pixels": np.full((4, 2, 2), fill, np.uint8),
        "action": np.zeros((4, 2), np.float32),
        "reward": np.zeros(4, np.float32),
    }


def test_dumps_keep_the_first_episodes_column_order(tmp_path):
    rb = zreplay.ReplayBuffer(100)
    rb.write_episode(_three_columns())
    rb.dump(tmp_path / "e.h5")
    rb.dump(tmp_path / "z", format="zarr")
    want = rb.column_names
    assert want == ["pixels", "action", "reward"]
    assert zreplay.load_hdf5(tmp_path / "e.h5").column_names == want
    assert list(next(zreplay.iter_hdf5(tmp_path / "e.h5"))) == want
    assert zreplay.ReplayBuffer(100, path=tmp_path / "z").column_names == want
    rb.close()


def test_a_zarr_dump_appended_to_a_buffer_keeps_that_buffers_state(tmp_path):
    from zreplay.samplers import Prioritized

    path = tmp_path / "rb"
    rb = zreplay.ReplayBuffer(1000, path=path, seed=7, sampler=Prioritized())
    for i in range(3):
        rb.write_episode(_three_columns(i))
    for _ in range(5):
        batch = rb.sample(4)
    rb.update_priorities(batch["index"], np.full(4, 9.0))
    before = (rb.step, rb.column_names, rb.priorities(batch["index"]).tolist())
    rb.close()
    other = zreplay.ReplayBuffer(100)
    other.write_episode(_three_columns(9))
    other.dump(path, format="zarr", mode="append")
    other.close()
    rb = zreplay.ReplayBuffer(1000, path=path, sampler=Prioritized())
    assert rb.num_episodes == 4
    assert (rb.step, rb.column_names, rb.priorities(batch["index"]).tolist()) == before
    rb.close()
    t_path = tmp_path / "trb"  # a TrajectoryReplayBuffer keeps its seed too
    t = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(t_path), seed=1234)
    t.add_trajectories([{k: np.stack([v, v], 1) for k, v in _three_columns().items()}])
    t.close()
    zreplay.dump(zreplay.open(path), t_path, format="zarr", mode="append")
    t = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(t_path))
    assert t.seed == 1234 and len(t) == 1 + 4
    t.close()


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_persistent_workers_serve_the_commit_a_flush_made_after_a_clear(tmp_path, ctx):
    """Two persistent DataLoader workers over a ReplayBuffer: after clear(), new writes
    and flush(), every item they serve comes from the new commit (pixels >= 7000),
    never a cleared episode, and an epoch covers exactly the new clips; also after the
    buffer grows again without a clear."""
    b = zreplay.ReplayBuffer(500, history_len=2, path=tmp_path / "pw")
    fill(b, [12, 9])  # pixels 1000.. and 2000..: 11 + 8 clips
    b.flush()
    loader = DataLoader(
        b, batch_size=4, shuffle=True, num_workers=2, persistent_workers=True,
        multiprocessing_context=mp.get_context(ctx),
    )  # fmt: skip
    first = _collect(loader)
    assert len(first) == len(b) == 19 and all(c[0] < 3000 for c in first)
    b.clear()
    b.write_episode(episode(6, base=7000))
    b.write_episode(episode(5, base=8000))
    b.flush()
    second = _collect(loader)  # the same two worker processes
    assert len(second) == len(b) == 5 + 4
    assert all(c[0] >= 7000 for c in second), second
    assert sorted(map(tuple, second)) == sorted(
        [(7000 + i, 7001 + i) for i in range(5)] + [(8000 + i, 8001 + i) for i in range(4)]
    )
    b.write_episode(episode(4, base=9000))
    b.flush()
    third = _collect(loader)
    assert len(third) == 12 and {c[0] // 1000 for c in third} == {7, 8, 9}
    b.close()


def test_replay_buffer_positions_are_stable_worldmodels(rb):
    """Clip indices count from the end as stable-worldmodel's do; episode indices are
    0..num_episodes-1 only (its _load_slice refuses -1): the facade keeps its indexing,
    not numpy's (tests/test_swm_protocol.py compares the messages with its code)."""
    fill(rb, [5, 6])
    n = len(rb)
    assert rb[-1]["pixels"][:, 0, 0].tolist() == rb[n - 1]["pixels"][:, 0, 0].tolist()
    assert rb[np.int64(0)]["pixels"][0, 0, 0] == 1000
    assert rb.load_episode(1)["pixels"][:, 0, 0].tolist() == list(range(2000, 2006))
    for bad in (n, -n - 1):
        with pytest.raises(IndexError):
            rb[bad]
    for bad in (2, -1):
        with pytest.raises(IndexError):
            rb.load_episode(bad)
