"""examples/ray_actors.py runs end to end (tiny shapes): two Ray rollout actors, a
rate-limited, staleness-aware learner in the driver."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ray_actors.py"


def test_ray_actors_example(tmp_path):
    args = ["--path", str(tmp_path / "buf"), "--actors", "2", "--rollouts", "4", "--T", "5"]
    args += ["--B", "2", "--img", "8", "--batch", "16", "--update-every", "3"]
    args += ["--samples-per-insert", "2", "--max-staleness", "1", "--json"]
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    got = json.loads(line[len("RESULT ") :])
    assert got["rows"] == 2 * 4 * 5 * 2  # every actor's trajectories, all committed
    assert got["learner_batches"] > 0 and got["stale_rows_drawn"] == 0
    # rate-limited at 2 samples per row (+- the error buffer of 4 trajectories' rows)
    assert got["learner_batches"] * 16 <= 2 * got["rows"] + 2 * 4 * 10
