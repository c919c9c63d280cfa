"""Damaged stores: checksummed chunks, verify(), truncated commit records."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import check_rows, make_traj

import zreplay
from zreplay import CorruptBufferError


@pytest.fixture
def written(bufpath):
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=bufpath) as buf:
        buf.add_trajectories([make_traj(i) for i in range(4)])
    return Path(bufpath)


def shard_file(root: Path, key: str) -> Path:
    d = root / "segments" / "default" / "data" / key / "c"
    return next(Path(r) / f for r, _, fs in os.walk(d) for f in fs)


def test_healthy_buffer_verifies(written):
    report = zreplay.verify(written)
    assert report.ok, str(report)
    assert report.trajectories == 4 and report.rows_checked == 4 * 18 * len(
        zreplay.open(written).keys()
    )


def test_flipped_byte_is_an_error_naming_the_key_never_wrong_data(written):
    f = shard_file(written, "rewards")
    data = bytearray(f.read_bytes())
    data[len(data) // 3] ^= 0x40  # inside a compressed chunk, not the shard index
    f.write_bytes(bytes(data))
    report = zreplay.verify(written)
    assert not report.ok and len(report.problems) == 1
    assert "key 'rewards'" in report.problems[0] and "rows [0, " in report.problems[0]
    with zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(written), enable_cache=False, sample_window_size=0
    ) as buf:
        with pytest.raises(CorruptBufferError, match="key 'rewards'"):
            for _ in range(20):
                check_rows(buf.sample(64))
    with pytest.raises(CorruptBufferError, match="rewards"):
        zreplay.open(written).trajectory(0)


def test_truncated_shard_is_reported(written):
    f = shard_file(written, "curr_obs/main_images")
    f.write_bytes(f.read_bytes()[:100])
    report = zreplay.verify(written)
    assert any("curr_obs/main_images" in p for p in report.problems)


def test_truncated_commit_record(written):
    commit = written / "segments" / "default" / "commit.json"
    commit.write_text(commit.read_text()[:40])
    report = zreplay.verify(written)
    assert not report.ok and "commit record is unreadable" in report.problems[0]
    with pytest.raises(CorruptBufferError, match="commit record is unreadable"):
        zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(written))
    with pytest.raises(CorruptBufferError):
        zreplay.open(written)


def test_verify_of_a_non_buffer(tmp_path):
    report = zreplay.verify(tmp_path)
    assert not report.ok and "not a zreplay buffer" in report.problems[0]
