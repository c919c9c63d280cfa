"""sample(device=, pin_memory=) and background prefetch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import check_rows, codes_of, make_traj

import zreplay


def filled(path, seed=5):
    buf = zreplay.TrajectoryReplayBuffer(
        seed=seed, auto_save=True, auto_save_path=str(path), cache_size=1, sample_window_size=0
    )
    buf.add_trajectories([make_traj(i) for i in range(6)])
    return buf


def test_device_cpu_same_rows(tmp_path):
    with filled(tmp_path / "a") as a, filled(tmp_path / "b") as b:
        x, y = a.sample(64), b.sample(64, device="cpu")
        assert y["actions"].device.type == "cpu"
        assert np.array_equal(codes_of(x), codes_of(y))
        check_rows(y)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-accelerator fallback")
def test_pin_memory_without_cuda_warns_and_still_samples(tmp_path):
    import zreplay.api.batches as mod

    mod._pin_warned = False
    with filled(tmp_path / "a") as buf:
        with pytest.warns(UserWarning, match="no CUDA device"):
            s = buf.sample(32, pin_memory=True)
        check_rows(s)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pinned_then_cuda(tmp_path):
    with filled(tmp_path / "a") as buf:
        s = buf.sample(32, pin_memory=True)
        assert s["actions"].is_pinned() and s["curr_obs"]["main_images"].is_pinned()
        g = buf.sample(32, device="cuda", pin_memory=True)
        assert g["actions"].device.type == "cuda"
        check_rows(
            {
                k: (v.cpu() if hasattr(v, "cpu") else {kk: vv.cpu() for kk, vv in v.items()})
                for k, v in g.items()
            }
        )


def test_prefetch_yields_the_same_stream_in_order(tmp_path):
    with filled(tmp_path / "a", seed=9) as a, filled(tmp_path / "b", seed=9) as b:
        want = [codes_of(a.sample(16)) for _ in range(5)]
        with b.prefetch(16, depth=3) as it:
            got = [codes_of(next(it)) for _ in range(5)]
        for w, g in zip(want, got, strict=True):
            assert np.array_equal(w, g)


def test_prefetch_raises_the_sampler_error_instead_of_hanging(tmp_path):
    with zreplay.TrajectoryReplayBuffer() as empty:
        it = empty.prefetch(8)
        with pytest.raises(zreplay.EmptyBufferError):
            next(it)
        with pytest.raises(StopIteration):
            next(it)
