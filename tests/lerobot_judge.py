"""Running LeRobot's (and Minari's) own code from the tests: the judge environment.

LeRobot 0.4.4 needs pins the project's venv cannot hold, so it lives in a venv of its own
(``.ci/lerobot-env DIR``); ``.ci/run`` exports ``ZREPLAY_LEROBOT_PYTHON=DIR/bin/python``.
The tests run scripts of ``tests/judges/`` there as subprocesses and compare what they
write with what zreplay reads in the project's venv.

API (small on purpose; shared by the LeRobot import, export and Minari tests):

* :data:`JUDGE_PYTHON`: the judge interpreter, or None when the variable is unset.
* :func:`needs_judge`: a decorator for tests that need it: ``slow``, and skipped with
  the reason when the variable is unset (never a silent pass).
* :func:`run_judge(script, *args, scratch)`: run ``tests/judges/<script>`` there with
  ``HF_HUB_OFFLINE=1``, ``HF_HOME``/``HF_DATASETS_CACHE`` under ``scratch``, this
  checkout's ``src`` and the test-only torchvision stand-in first on ``PYTHONPATH``;
  returns its stdout, raises ``AssertionError`` with its output when it fails.
* :func:`run_judge_module(module, *args, scratch)`: the same for ``python -m module``
  (LeRobot's own scripts, e.g. its v2.1-to-v3.0 converter).
* :func:`run_judge_source(source, *args, scratch)`: the same for a script given as
  Python source (written to ``scratch``).
* :func:`judge_python`: the interpreter, or a skip naming the variable (read when called).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
JUDGES = TESTS / "judges"
SRC = TESTS.parent / "src"
ENV_VAR = "ZREPLAY_LEROBOT_PYTHON"
JUDGE_PYTHON: str | None = os.environ.get(ENV_VAR) or None
# A judge script may encode AV1 video and start torch: minutes, not hours.
TIMEOUT_S = 900

_SKIP = pytest.mark.skipif(
    JUDGE_PYTHON is None,
    reason=(
        f"needs LeRobot's own code: build its venv with `.ci/lerobot-env DIR` and set "
        f"{ENV_VAR}=DIR/bin/python (.ci/run does both)"
    ),
)


def needs_judge(test):
    """Mark ``test`` as needing the judge venv: slow, and skipped with the reason when
    ``ZREPLAY_LEROBOT_PYTHON`` is unset."""
    return pytest.mark.slow(_SKIP(test))


def judge_env(scratch: Path) -> dict[str, str]:
    """The environment judge scripts run in: offline, caches under ``scratch``."""
    hf = Path(scratch) / "hf"
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        HF_HOME=str(hf),
        HF_DATASETS_CACHE=str(hf / "datasets"),
        MINARI_DATASETS_PATH=str(Path(scratch) / "minari"),
        PYTHONPATH=os.pathsep.join([str(SRC), str(JUDGES)]),
        PYTHONUNBUFFERED="1",
    )
    return env


def judge_python() -> str:
    """The judge venv's python, or a skip saying how to get one."""
    python = os.environ.get(ENV_VAR)
    if not python:
        pytest.skip(
            f"{ENV_VAR} is unset: build LeRobot's environment with .ci/lerobot-env DIR and "
            f"set {ENV_VAR}=DIR/bin/python (.ci/run does both)"
        )
    return python


def _run(argv: list[str], scratch: Path) -> str:
    proc = subprocess.run(
        [judge_python(), *argv],
        env=judge_env(scratch),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=str(scratch),
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"judge {' '.join(argv)} failed with status {proc.returncode}:\n"
            f"{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
        )
    return proc.stdout


def run_judge(script: str, *args: object, scratch: Path) -> str:
    """Run ``tests/judges/<script>`` with ``args`` in the judge venv; its stdout."""
    return _run([str(JUDGES / script), *map(str, args)], Path(scratch))


def run_judge_module(module: str, *args: object, scratch: Path) -> str:
    """Run ``python -m module args`` in the judge venv; its stdout."""
    return _run(["-m", module, *map(str, args)], Path(scratch))


def run_judge_source(source: str, *args: object, scratch: Path) -> str:
    """Run Python ``source`` with ``args`` in the judge venv; its stdout."""
    path = Path(scratch) / "judge_script.py"
    path.write_text(source)
    return _run([str(path), *map(str, args)], Path(scratch))


def project_python() -> str:
    """The interpreter running the tests (the project's venv)."""
    return sys.executable
