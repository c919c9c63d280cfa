"""Running LeRobot's and Minari's own code for the export and Minari tests: scripts run by
the judge environment's Python (``ZREPLAY_LEROBOT_PYTHON``, built by ``.ci/lerobot-env``),
never imported into the project's.  A test that needs it skips, naming the variable, when
it is unset."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VARIABLE = "ZREPLAY_LEROBOT_PYTHON"


def judge_python() -> str:
    """The judge venv's python, or a skip saying how to get one."""
    python = os.environ.get(VARIABLE)
    if not python:
        pytest.skip(
            f"{VARIABLE} is unset: build LeRobot's environment with .ci/lerobot-env DIR and "
            f"set {VARIABLE}=DIR/bin/python (.ci/run does both)"
        )
    return python


def run_judge(script: str, *args, tmp: Path, timeout: float = 600) -> str:
    """Run ``script`` (Python source) in the judge venv with ``args``; its stdout.  This
    checkout's ``src`` and the test-only torchvision stand-in come first on the path, and
    Hugging Face is offline with its caches under ``tmp``."""
    python = judge_python()
    path = tmp / "judge_script.py"
    path.write_text(script)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests/judges")]),
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp / "hf"),
        "HF_DATASETS_CACHE": str(tmp / "hf/datasets"),
        "MINARI_DATASETS_PATH": str(tmp / "minari"),
    }
    r = subprocess.run(
        [python, str(path), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if r.returncode:
        raise AssertionError(f"judge script failed ({r.returncode}):\n{r.stderr[-4000:]}")
    return r.stdout
