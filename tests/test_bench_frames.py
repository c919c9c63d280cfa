"""benchmarks/bench_frames.py measures what it says: lossless candidates give back every
pixel, the predictive filters invert, PSNR and the 40 dB pick are right, and a run writes
the JSON that benchmarks/report.py turns into docs rows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_frames  # noqa: E402
import report  # noqa: E402


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_row_delta_inverts_exactly_with_uint8_wraparound(axis):
    f = np.random.default_rng(axis).integers(0, 256, (7, 5, 3), dtype=np.uint8)
    d = bench_frames._delta(f, axis)
    assert d.dtype == np.uint8 and not np.array_equal(d, f)
    np.testing.assert_array_equal(bench_frames._undelta(d, axis), f)


def test_psnr():
    a = np.full((4, 4, 3), 100, np.uint8)
    assert bench_frames.psnr(a, a) == float("inf")
    b = a + np.uint8(1)  # MSE 1
    assert bench_frames.psnr(a, b) == pytest.approx(10 * np.log10(255.0**2))


def test_sim_and_camera_frames_are_moving_uint8_sequences():
    sim = bench_frames.sim_frames(3, 32, seed=0)
    assert sim.shape == (3, 32, 32, 3) and sim.dtype == np.uint8
    assert not np.array_equal(sim[0], sim[2])
    photo = np.random.default_rng(0).integers(0, 256, (120, 160, 3), dtype=np.uint8)
    cam = bench_frames.camera_frames([photo], 4, 24, 32, seed=0)
    assert cam.shape == (4, 24, 32, 3) and cam.dtype == np.uint8
    assert not np.array_equal(cam[0], cam[3])


def _frames(channels: int) -> np.ndarray:
    frames = bench_frames.with_noise(bench_frames.sim_frames(3, 32, seed=1), 2.0, seed=2)
    return frames[..., :1] if channels == 1 else frames


@pytest.mark.parametrize("channels", [3, 1])
def test_every_lossless_candidate_gives_back_every_pixel(channels):
    pytest.importorskip("imagecodecs")
    frames = _frames(channels)
    measured = 0
    for cand in bench_frames.candidates():
        if not cand.lossless:
            continue
        r = bench_frames.measure(cand, frames, repeats=1, budget_s=0)
        if "error" in r:  # WebP and QOI refuse one channel; nothing else may fail
            assert channels == 1 and "invalid data shape" in r["error"], (cand.name, r)
            continue
        measured += 1
        assert r["psnr_db"] is None and r["bytes_per_frame"] > 0, cand.name
        assert r["encode_passes_1t"] == r["decode_passes_2t"] == 1
    assert measured >= 12


def test_lossy_candidates_report_psnr_against_stored_and_clean_frames():
    pytest.importorskip("imagecodecs")
    clean = bench_frames.sim_frames(3, 32, seed=1)
    noisy = bench_frames.with_noise(clean, 2.0, seed=2)
    jpeg = next(c for c in bench_frames.candidates() if c.name == "JPEG q75 420")
    r = bench_frames.measure(jpeg, noisy, repeats=1, budget_s=0, clean=clean)
    assert 15 < r["psnr_db"] < 60 and 15 < r["psnr_vs_clean_db"] < 60
    assert r["psnr_min_frame_db"] <= r["psnr_db"] + 1e-9


def test_smallest_setting_meeting_40db_is_the_fewest_bytes_that_reach_it():
    fam = [
        bench_frames.Candidate(n, False, None, None, family="X", setting=q)
        for n, q in (("X q50", 50), ("X q80", 80), ("X q95", 95))
    ]
    results = {
        "photo-8x8": {
            "X q50": {"bytes_per_frame": 10, "psnr_db": 35.0},
            "X q80": {"bytes_per_frame": 20, "psnr_db": 40.5},
            "X q95": {"bytes_per_frame": 30, "psnr_db": 45.0},
        },
        "photo-8x8-noisy": {
            "X q50": {"error": "refused"},
            "X q80": {"bytes_per_frame": 5, "psnr_db": 39.9},
        },
        "sim-8": {"X q50": {"bytes_per_frame": 1, "psnr_db": 90.0}},
    }
    got = bench_frames.smallest_meeting_psnr(results, fam)
    assert got == {"photo-8x8": {"X": "X q80"}, "photo-8x8-noisy": {"X": None}}


@pytest.mark.slow  # encodes frames with every candidate and writes two buffers
def test_a_run_writes_json_that_report_turns_into_rows(tmp_path):
    pytest.importorskip("imagecodecs")
    pytest.importorskip("ale_py")
    pytest.importorskip("skimage")
    out = tmp_path / "frames.json"
    sets = ["--sets", "sim-96", "sim-224-noisy"]
    argv = ["--quick", *sets, "--reference-frames", "32", "--budget", "0", "--out", str(out)]
    assert bench_frames.main(argv) == 0
    data = json.loads(out.read_text())
    assert set(data["results"]) == {"sim-96", "sim-224-noisy"}
    png = data["results"]["sim-96"]["PNG (libpng)"]
    assert png["over_png"] == 1.0 and 0 < png["over_raw"] < 1
    assert data["results"]["sim-224-noisy"]["JPEG q90 444"]["psnr_vs_clean_db"] > 20
    assert data["machine"]["git"]["head"] is not None
    ref = data["reference"]["photo-224x224-noisy"]
    assert ref["frames"] == 32 and 0 < ref["disk_bytes_per_frame"] < 224 * 224 * 3
    assert ref["sample"]["no_chunk_cache"]["n"] == 5 and ref["png_decode_256"]["median_s"] > 0
    rows = list(report._rows(report._benchmark(out, data), data))
    assert "frames atari: zreplay today's bytes per frame on disk" in {r[0] for r in rows}
    assert rows == [
        (r["figure"], r["zreplay"], f"{r['peer']} {report._ratio(r['ratio'])}".strip())
        for r in data["rows"]
    ]


def test_the_readme_shows_the_tables_of_the_committed_run():
    data = json.loads((ROOT / "benchmarks" / "results" / "frames.json").read_text())
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    for table in bench_frames.markdown(data).split("\n\n"):
        assert table in readme, (
            "benchmarks/README.md is stale: python benchmarks/bench_frames.py "
            "--markdown benchmarks/results/frames.json"
        )
