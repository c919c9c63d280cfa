"""Two torch.distributed ranks (gloo, two processes) share one buffer directory:
load_checkpoint(is_distributed=True) and rank_loader give disjoint shares covering all."""

from __future__ import annotations

import socket

import numpy as np
import pytest
import torch
from conftest import check_rows, make_traj, processes, run_children

import zreplay
from zreplay.core.ranks import rank_block

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gathered(obj) -> list:
    import torch.distributed as dist

    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _rank_main(rank: int, port: int, sources: dict, tmp: str) -> dict:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    try:
        report = {}
        # RLinf's API: each rank loads its contiguous block of a checkpoint.
        for name, src in sources.items():
            with zreplay.TrajectoryReplayBuffer(
                auto_save=True, auto_save_path=f"{tmp}/{name}-rank{rank}"
            ) as buf:
                buf.load_checkpoint(src, is_distributed=True, local_rank=rank, world_size=WORLD)
                ids = [buf.trajectory(i)["trajectory_id"] for i in range(len(buf))]
                check_rows(buf.sample(64))
            report[name] = _gathered(ids)
        # The rank-aware open: rank and world size come from the process group.
        src = sources["two writers"]
        uneven = zreplay.rank_loader(src, batch_size=16, even=False, shuffle=False)
        codes = np.concatenate([check_rows(b) for b in uneven])
        report["rows"] = _gathered(codes.tolist())
        report["share"] = _gathered(uneven.dataset.trajectories)
        even = zreplay.rank_loader(src, batch_size=16, seed=3)
        batches = [check_rows(b) for b in even]
        assert all(isinstance(b, np.ndarray) for b in batches)
        report["even"] = _gathered((len(batches), sum(map(len, batches))))
        report["trajectories_seen"] = _gathered(sorted({int(c) // 10000 for c in codes}))
        # Ranks that see different commits refuse instead of overlapping.
        early = zreplay.open(src) if rank == 1 else None
        dist.barrier()
        if rank == 0:
            with zreplay.TrajectoryReplayBuffer(
                auto_save=True, auto_save_path=src, writer_id="late"
            ) as buf:
                buf.add_trajectories([make_traj(999, T=3, B=2)])
        dist.barrier()
        view = early if rank == 1 else zreplay.open(src)
        with pytest.raises(RuntimeError, match="ranks see different commits"):
            zreplay.rank_loader(view, batch_size=16)
        return report
    finally:
        dist.destroy_process_group()


def _source(path, writers: dict) -> list[int]:
    """A buffer with one segment per writer id; returns the trajectory ids in view order."""
    for wid, seqs in writers.items():
        with zreplay.TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=str(path), writer_id=wid
        ) as buf:
            buf.add_trajectories([make_traj(s, T=3 + s % 4, B=2) for s in seqs])
    view = zreplay.open(path)
    return [view.trajectory(i)["trajectory_id"] for i in range(view.num_trajectories)]


def test_two_gloo_ranks_split_a_buffer_disjointly_and_completely(tmp_path):
    one = _source(tmp_path / "one", {"default": range(7)})  # shares are hard-linked
    two = _source(tmp_path / "two", {"a": range(5), "b": range(100, 106)})  # shares are copied
    view = zreplay.open(tmp_path / "two")
    all_rows = check_rows(view.rows(np.arange(view.num_rows)))
    sources = {"one writer": str(tmp_path / "one"), "two writers": str(tmp_path / "two")}
    port = _free_port()
    reports = run_children(
        [(_rank_main, (r, port, sources, str(tmp_path))) for r in range(WORLD)], timeout=120
    )
    assert reports[0] == reports[1]  # every gathered value is the same on both ranks
    rep = reports[0]
    for name, want in (("one writer", one), ("two writers", two)):
        shares = rep[name]
        for r, ids in enumerate(shares):  # RLinf's contiguous blocks, in view order
            assert ids == want[slice(*rank_block(len(want), r, WORLD))], name
        assert sorted(shares[0] + shares[1]) == sorted(want)
    # rank_loader without even: every row of the buffer exactly once, over both ranks.
    assert rep["share"] == [(0, 6), (6, 11)]
    assert sorted(rep["rows"][0] + rep["rows"][1]) == sorted(all_rows.tolist())
    seqs = [set(s) for s in rep["trajectories_seen"]]
    assert not seqs[0] & seqs[1] and seqs[0] | seqs[1] == set(range(5)) | set(range(100, 106))
    # even: the same number of batches and rows on both ranks (the smaller share's rows).
    assert rep["even"][0] == rep["even"][1]
    assert rep["even"][0][1] == min(len(rep["rows"][0]), len(rep["rows"][1]))


def test_rank_shard_in_dataloader_workers_reads_the_same_rows_after_new_commits(tmp_path):
    _source(tmp_path / "buf", {"a": range(4), "b": range(100, 104)})
    view = zreplay.open(tmp_path / "buf")
    shard = zreplay.RankShard(view, rank=1, world_size=2)
    want = check_rows(shard[list(range(len(shard)))])
    assert sorted(want // 10000) == sorted(
        [100 + i for i in range(4) for _ in range((3 + (100 + i) % 4) * 2)]
    )
    # Writer "a" (before "b" in position order) commits more: positions of b's rows shift;
    # workers reopen the directory and must still read this rank's rows.
    _source(tmp_path / "buf", {"a": range(4, 8)})
    loader = torch.utils.data.DataLoader(
        shard, batch_size=None, sampler=torch.utils.data.BatchSampler(
            range(len(shard)), 5, False), num_workers=2, multiprocessing_context=processes()
    )  # fmt: skip
    got = np.concatenate([check_rows(b) for b in loader])
    np.testing.assert_array_equal(got, want)
    assert shard[3]["actions"].shape == (6,) and shard[3]["actions"][0] == want[3]  # one row
    with pytest.raises(ValueError, match="outside"):
        zreplay.RankShard(view, rank=2, world_size=2)


@pytest.mark.parametrize("even", [False, True])
def test_rank_loader_gives_a_rank_with_no_share_an_empty_loader(tmp_path, even):
    path = str(tmp_path / "b")
    b = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path)
    for i in range(3):
        b.add_trajectories(
            [{"uid": np.arange(8).reshape(4, 2) + 8 * i, "rewards": np.zeros((4, 2), np.float32)}]
        )
    b.close()
    got = [
        [
            int(u)
            for x in zreplay.rank_loader(path, rank=r, world_size=4, batch_size=2, even=even)
            for u in x["uid"]
        ]
        for r in range(4)
    ]
    if even:  # every rank the same number of trajectories: none for anyone
        assert got == [[], [], [], []]
    else:
        assert sorted(u for share in got for u in share) == list(range(24))
        assert [] in got
