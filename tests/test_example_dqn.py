"""examples/dqn_cartpole.py end to end, shortened for CI: a run killed halfway by
``--kill-at`` (``os._exit``, nothing flushed or closed) is resumed from its checkpoint and
its on-disk zreplay buffer.  Learning is not asserted (3000 steps are far too few)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import zreplay

pytest.importorskip("gymnasium")

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "dqn_cartpole.py"
KILL_EXIT_CODE = 3  # the script's os._exit code for --kill-at (1 means "not solved")
FAST = [
    "--checkpoint-every", "500",
    "--warmup", "500",
    "--log-every", "1000",
    "--eps-decay-steps", "2000",
    "--batch-size", "64",
    "--eval-episodes", "2",
]  # fmt: skip


def run(run_dir: Path, *args: str) -> tuple[int, dict[str, list[dict]], str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--run-dir", str(run_dir), *FAST, *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    tagged: dict[str, list[dict]] = {}
    for line in proc.stdout.splitlines():
        tag, _, rest = line.partition(" ")
        if tag in ("FRESH", "RESUME", "CHECKPOINT", "KILL", "RESULT"):
            tagged.setdefault(tag, []).append(json.loads(rest))
    return proc.returncode, tagged, proc.stdout + proc.stderr


@pytest.mark.slow  # a multi-process soak: python -m pytest -m slow
def test_kill_halfway_then_resume(tmp_path):
    run_dir = tmp_path / "dqn"

    rc, out, log = run(run_dir, "--total-steps", "3000", "--kill-at", "1500", "--seed", "0")
    assert rc == KILL_EXIT_CODE, log
    assert "RESULT" not in out, log
    assert out["KILL"] == [{"env_step": 1500, "episodes": out["KILL"][0]["episodes"]}]
    ckpts = out["CHECKPOINT"]
    assert ckpts and all(c["env_step"] < 1500 for c in ckpts), log
    last = ckpts[-1]
    assert last["buffer_steps"] > 0
    assert (run_dir / "checkpoint.pt").is_file()
    assert not (run_dir / "checkpoint.pt.tmp").exists()
    # The crash left a consistent store (and a stale writer lock the next run takes over).
    report = zreplay.verify(run_dir / "buffer")
    assert report.ok, str(report)

    rc, out, log = run(run_dir, "--total-steps", "3000", "--seed", "0", "--no-require-solved")
    assert rc == 0, log
    (resume,) = out["RESUME"]
    assert resume["env_step"] == last["env_step"]
    assert resume["episodes"] == last["episodes"]
    assert resume["checkpoint_buffer_steps"] == last["buffer_steps"]
    # Everything flushed before the checkpoint is still there (the background writer may
    # have committed more before the kill).
    assert resume["buffer_steps"] >= last["buffer_steps"]
    assert resume["buffer_episodes"] >= last["buffer_episodes"]
    (result,) = out["RESULT"]
    assert result["resumed"] is True
    assert result["env_steps"] == 3000
    assert result["episodes"] > last["episodes"]
    assert result["buffer_steps"] >= resume["buffer_steps"] > 0
    assert result["buffer_steps_at_start"] == resume["buffer_steps"]
    assert result["eval_episodes"] == 2
    assert zreplay.verify(run_dir / "buffer").ok

    view = zreplay.open(run_dir / "buffer")  # read-only, no lock
    assert view.num_rows == result["buffer_steps"]
    assert view.num_episodes == result["buffer_episodes"]
    rb = zreplay.ReplayBuffer(max_steps=50_000, path=run_dir / "buffer")
    try:
        assert rb.num_steps_stored == result["buffer_steps"]
        assert rb.num_episodes == result["buffer_episodes"]
        table = rb.episode_table()
        # CartPole episodes end terminated (pole fell) or truncated (500 steps), never both.
        assert (table["terminated"] ^ table["truncated"]).all()
        assert int(table["length"].sum()) == result["buffer_steps"]
    finally:
        rb.close()


@pytest.mark.slow  # a multi-process soak: python -m pytest -m slow
def test_killed_before_first_checkpoint_starts_fresh_on_the_kept_buffer(tmp_path):
    run_dir = tmp_path / "dqn"
    rc, out, log = run(run_dir, "--total-steps", "800", "--kill-at", "400", "--seed", "1")
    assert rc == KILL_EXIT_CODE, log
    assert "CHECKPOINT" not in out and not (run_dir / "checkpoint.pt").exists()

    rc, out, log = run(run_dir, "--total-steps", "800", "--seed", "1", "--no-require-solved")
    assert rc == 0, log
    (fresh,) = out["FRESH"]
    (result,) = out["RESULT"]
    assert result["resumed"] is False
    assert result["buffer_steps_at_start"] == fresh["buffer_steps"]
    assert result["buffer_steps"] >= fresh["buffer_steps"]
    assert result["env_steps"] == 800
