"""The column cache file asks the kernel for 2 MiB pages (``engine/colcache.py``,
``_ask_huge_pages``): random draws over a large ring then cost no TLB miss or page fault
per row, in the process that filled it and in every process mapping it afterwards.  A
ring larger than half the machine's memory keeps 4 KiB pages (a fault there may read
from disk).  Checked in ``/proc/self/smaps``: ``hg`` in a mapping's ``VmFlags``."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import zreplay
from zreplay.engine import colcache

pytestmark = pytest.mark.skipif(
    not Path("/sys/kernel/mm/transparent_hugepage").exists(),
    reason="needs Linux with transparent huge pages (/proc/self/smaps, MADV_HUGEPAGE)",
)


def cache_file_flags() -> dict[str, set[str]]:
    """``VmFlags`` of each mapping of a file under this run's column cache directory."""
    root = os.environ["ZREPLAY_CACHE_DIR"]
    out, current = {}, None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if parts and not parts[0].endswith(":"):  # a mapping's header line
                path = parts[5] if len(parts) > 5 else ""
                current = path if path.startswith(root) else None
            elif current is not None and parts and parts[0] == "VmFlags:":
                out[current] = set(parts[1:])
    return out


def state_buffer(path: Path, rows: int) -> None:
    """A buffer of ``rows`` rows of ``obs`` f32[8] and ``rewards`` f32 (36 B a row)."""
    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path))
    T, B = 1000, rows // 1000
    buf.add_trajectories(
        [
            {
                "obs": np.arange(T * B * 8, dtype=np.float32).reshape(T, B, 8),
                "rewards": np.ones((T, B), np.float32),
            }
        ]
    )
    buf.close()


def test_a_view_maps_its_column_cache_file_with_huge_pages_asked_for(tmp_path):
    path = tmp_path / "b"
    state_buffer(path, 100_000)  # 3.6 MB of small columns: more than one 2 MiB page
    before = cache_file_flags()  # (files other tests' views still map)
    view = zreplay.open(path, seed=0)
    got = view.sample(64)
    assert got["obs"].shape == (64, 8)
    flags = {k: v for k, v in cache_file_flags().items() if k not in before}
    assert flags, "the view mapped no column cache file"
    assert all("hg" in f for f in flags.values()), flags
    again = zreplay.open(path, seed=1)  # a second process-like reader maps the same file
    again.sample(8)
    assert all("hg" in f for k, f in cache_file_flags().items() if k not in before)
    view.close()
    again.close()


def test_a_ring_larger_than_half_the_memory_keeps_the_kernels_pages(tmp_path, monkeypatch):
    path = tmp_path / "b"
    state_buffer(path, 100_000)
    monkeypatch.setattr(colcache, "default_budget", lambda: 4 << 20)  # "memory": 4 MiB
    before = cache_file_flags()  # (files other tests' views still map)
    view = zreplay.open(path, seed=0, column_cache_bytes=64 << 20)
    view.sample(64)
    flags = {k: v for k, v in cache_file_flags().items() if k not in before}
    assert flags, "the view mapped no column cache file"
    assert not any("hg" in f for f in flags.values()), flags
    view.close()
