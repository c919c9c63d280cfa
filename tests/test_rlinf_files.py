"""RLinf 0.3 directories both ways: export, import, and load_checkpoint from them."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch
from conftest import check_rows, make_traj, traj_equal, tree_state

import zreplay
from zreplay import PickleRefusedError


@pytest.fixture
def src(tmp_path):
    trajs = [make_traj(i, T=4 + i, B=2, epochs=2 if i % 2 == 0 else 0) for i in range(5)]
    with zreplay.TrajectoryReplayBuffer(
        seed=42, auto_save=True, auto_save_path=str(tmp_path / "src")
    ) as buf:
        buf.add_trajectories(trajs)
        yield buf, trajs


@pytest.mark.parametrize("fmt", ["pt", "pkl"])
def test_export_writes_rlinf_layout(src, tmp_path, fmt):
    buf, trajs = src
    out = tmp_path / "rl"
    assert buf.export(str(out), fmt) == 5
    meta = json.loads((out / "metadata.json").read_text())
    assert meta == {
        "trajectory_format": fmt,
        "size": 5,
        "total_samples": buf.total_samples,
        "trajectory_counter": 5,
        "seed": 42,
    }
    idx = json.loads((out / "trajectory_index.json").read_text())
    assert idx["trajectory_id_list"] == [0, 1, 2, 3, 4]
    for i, t in enumerate(trajs):
        e = idx["trajectory_index"][str(i)]
        wid = buf.trajectory(i)["model_weights_id"]
        assert e == {
            "num_samples": (4 + i) * 2,
            "trajectory_id": i,
            "max_episode_length": 100 + i,
            "shape": list(t.prev_logprobs.shape),
            "model_weights_id": wid,
        }
        path = out / f"trajectory_{i}_{wid}.{fmt}"
        if fmt == "pt":
            d = torch.load(path, weights_only=True)
        else:
            with open(path, "rb") as f:
                d = pickle.load(f)
        assert isinstance(d["actions"], torch.Tensor) and d["max_episode_length"] == 100 + i
        assert d["dones"].shape[0] == 4 + i  # bootstrap rows stripped: RLinf reads T rows as is
        traj_equal(
            {
                k: v.numpy()
                if isinstance(v, torch.Tensor)
                else {kk: vv.numpy() for kk, vv in v.items()}
                if isinstance(v, dict)
                else v
                for k, v in d.items()
            },
            t,
        )


@pytest.mark.parametrize("fmt", ["pt", "pkl"])
def test_export_import_round_trip_compares_every_array(src, tmp_path, fmt):
    buf, trajs = src
    buf.export(str(tmp_path / "rl"), fmt)
    kw = {"allow_pickle": True} if fmt == "pkl" else {}
    assert zreplay.import_rlinf(str(tmp_path / "rl"), str(tmp_path / "back"), **kw) == 5
    view = zreplay.open(tmp_path / "back")
    assert view.num_trajectories == 5 and view.num_rows == buf.total_samples
    for i in range(5):
        a, b = buf.trajectory(i), view.trajectory(i)
        assert a["trajectory_id"] == b["trajectory_id"] == i
        assert a["model_weights_id"] == b["model_weights_id"]
        assert a["max_episode_length"] == b["max_episode_length"]
        traj_equal(b, trajs[i])


def test_pickle_refused_without_allow_pickle(src, tmp_path):
    buf, _ = src
    buf.export(str(tmp_path / "rl"), "pkl")
    with pytest.raises(PickleRefusedError, match="allow_pickle=True"):
        zreplay.import_rlinf(str(tmp_path / "rl"), str(tmp_path / "back"))
    with zreplay.TrajectoryReplayBuffer() as other:
        other.add_trajectories([make_traj(9)])
        with pytest.raises(PickleRefusedError):
            other.load_checkpoint(str(tmp_path / "rl"))
        assert len(other) == 1  # refused before its contents were replaced
        other.load_checkpoint(str(tmp_path / "rl"), allow_pickle=True)
        assert len(other) == 5


def _write_rlinf_dir(path, trajs):
    """What RLinf 0.3's auto_save writes: raw trajectories (T+E flag rows), two JSONs."""
    path.mkdir()
    index, ids = {}, []
    for i, t in enumerate(trajs):
        d = {k: v for k, v in vars(t).items() if v is not None}
        d["model_weights_id"] = f"w{i % 2}"
        torch.save(d, path / f"trajectory_{i}_w{i % 2}.pt")
        index[str(i)] = {
            "num_samples": int(np.prod(t.rewards.shape[:2])),
            "trajectory_id": i,
            "max_episode_length": t.max_episode_length,
            "shape": list(t.rewards.shape),
            "model_weights_id": f"w{i % 2}",
        }
        ids.append(i)
    (path / "metadata.json").write_text(
        json.dumps(
            {
                "trajectory_format": "pt",
                "size": len(ids),
                "total_samples": 0,
                "trajectory_counter": len(ids),
                "seed": 5,
            }
        )
    )
    (path / "trajectory_index.json").write_text(
        json.dumps({"trajectory_index": index, "trajectory_id_list": ids})
    )


def test_load_checkpoint_from_rlinf_directory_sharded(tmp_path):
    trajs = [make_traj(i, T=4, B=2, epochs=2) for i in range(7)]
    _write_rlinf_dir(tmp_path / "rl", trajs)
    seen = []
    for rank in range(2):
        with zreplay.TrajectoryReplayBuffer() as buf:
            buf.load_checkpoint(
                str(tmp_path / "rl"), is_distributed=True, local_rank=rank, world_size=2
            )
            ids = [buf.trajectory(i)["trajectory_id"] for i in range(len(buf))]
            assert ids == ([0, 1, 2, 3] if rank == 0 else [4, 5, 6])
            for j, tid in enumerate(ids):
                traj_equal(buf.trajectory(j), trajs[tid])
                assert buf.trajectory(j)["model_weights_id"] == f"w{tid % 2}"
            check_rows(buf.sample(64))
            seen += ids
            assert buf.add_trajectories([make_traj(20)]) == [7]
    assert sorted(seen) == list(range(7))


def test_missing_trajectory_file_is_reported(tmp_path):
    trajs = [make_traj(i) for i in range(2)]
    _write_rlinf_dir(tmp_path / "rl", trajs)
    (tmp_path / "rl" / "trajectory_1_w1.pt").unlink()
    with pytest.raises(zreplay.CorruptBufferError, match="trajectory_1_w1.pt"):
        zreplay.import_rlinf(str(tmp_path / "rl"), str(tmp_path / "dst"))
    with zreplay.TrajectoryReplayBuffer() as buf:
        buf.add_trajectories([make_traj(5)])
        with pytest.raises(zreplay.CorruptBufferError, match="is missing"):
            buf.load_checkpoint(str(tmp_path / "rl"))
        assert len(buf) == 1 and buf.trajectory(0)["trajectory_id"] == 0


def test_hostile_index_never_reads_or_writes_outside(tmp_path):
    """An index entry whose model_weights_id leads out of the directory (the attacker
    ships the directory, so ``trajectory_0_/`` exists) is refused, not loaded."""
    trajs = [make_traj(i) for i in range(2)]
    rl = tmp_path / "rl"
    _write_rlinf_dir(rl, trajs)
    (tmp_path / "elsewhere").mkdir()
    torch.save(vars(make_traj(7)), tmp_path / "elsewhere" / "x.pt")
    (rl / "trajectory_0_").mkdir()
    idx = json.loads((rl / "trajectory_index.json").read_text())
    idx["trajectory_index"]["0"]["model_weights_id"] = "/../../elsewhere/x"
    (rl / "trajectory_index.json").write_text(json.dumps(idx))
    before = tree_state(tmp_path)
    with pytest.raises(zreplay.FormatError, match="cannot be part of a file name"):
        zreplay.import_rlinf(str(rl), str(tmp_path / "dst"))
    with zreplay.TrajectoryReplayBuffer() as buf, pytest.raises(zreplay.FormatError):
        buf.load_checkpoint(str(rl))
    idx["trajectory_index"] = {"zero": {}}  # not an integer id
    (rl / "trajectory_index.json").write_text(json.dumps(idx))
    with pytest.raises(zreplay.CorruptBufferError, match="must be integers"):
        zreplay.import_rlinf(str(rl), str(tmp_path / "dst"))
    assert {k: v for k, v in tree_state(tmp_path).items() if not k.startswith("rl")} == {
        k: v for k, v in before.items() if not k.startswith("rl")
    }  # refused before the destination was even created


@pytest.mark.parametrize("where", ["trajectory_id_list", "trajectory_index"])
def test_repeated_trajectory_id_names_the_source_file_and_the_id(tmp_path, where):
    trajs = [make_traj(i) for i in range(3)]
    rl = tmp_path / "rl"
    _write_rlinf_dir(rl, trajs)
    idx = json.loads((rl / "trajectory_index.json").read_text())
    if where == "trajectory_id_list":
        idx["trajectory_id_list"] = [0, 1, 1, 2]
    else:  # "1" and "01" are both trajectory 1
        idx["trajectory_index"]["01"] = idx["trajectory_index"]["1"]
    (rl / "trajectory_index.json").write_text(json.dumps(idx))
    before = tree_state(tmp_path)
    with pytest.raises(zreplay.CorruptBufferError) as e:
        zreplay.import_rlinf(str(rl), str(tmp_path / "dst"))
    msg = str(e.value)
    assert str(rl / "trajectory_index.json") in msg and "trajectory id 1 appears twice" in msg
    assert where in msg and ".partial" not in msg  # not the hidden destination
    assert tree_state(tmp_path) == before  # refused before the destination was created
    with zreplay.TrajectoryReplayBuffer() as buf:
        buf.add_trajectories([make_traj(5)])
        with pytest.raises(zreplay.CorruptBufferError, match="appears twice"):
            buf.load_checkpoint(str(rl))
        assert len(buf) == 1


def test_export_refuses_weights_ids_that_are_paths(tmp_path):
    with zreplay.TrajectoryReplayBuffer() as buf:
        buf.add_trajectories([make_traj(0)])
        t = make_traj(1)
        t.model_weights_id = "../../escaped"
        buf.add_trajectories([t])
        with pytest.raises(zreplay.FormatError, match="'../../escaped'"):
            buf.export(str(tmp_path / "out" / "rl"), "pt")
    assert {p.relative_to(tmp_path).parts[0] for p in tmp_path.rglob("*")} == {"out"}
    assert not list(tmp_path.rglob("*escaped*"))


def test_loading_rlinf_files_honours_continue_episodes(tmp_path):
    """RLinf files do not record that episodes go on across trajectories; a buffer made
    with continue_episodes=True joins them again on load and import (adversarial pass)."""
    src = str(tmp_path / "src")
    b = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=src, continue_episodes=True)
    for i in range(3):
        fl = np.zeros((5, 2), bool)
        fl[-1] = i == 2  # each lane: one episode over three trajectories
        b.add_trajectories(
            [
                {
                    "obs": np.zeros((5, 2, 3), np.float32),
                    "rewards": np.ones((5, 2), np.float32),
                    "terminations": fl,
                }
            ]
        )
    b.export(tmp_path / "rl", format="pt")
    b.close()
    assert zreplay.open(src).episode_table()["length"].tolist() == [15, 15]
    zreplay.import_rlinf(tmp_path / "rl", tmp_path / "cut")  # not asked: cut per trajectory
    assert zreplay.open(tmp_path / "cut").num_episodes == 6
    zreplay.import_rlinf(tmp_path / "rl", tmp_path / "joined", continue_episodes=True)
    assert zreplay.open(tmp_path / "joined").episode_table()["length"].tolist() == [15, 15]
    t = zreplay.TrajectoryReplayBuffer(continue_episodes=True)
    t.load_checkpoint(str(tmp_path / "rl"))
    assert t.core.num_episodes == 2
    t.close()
