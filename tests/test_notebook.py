"""``notebooks/inspect_buffer.ipynb`` runs top to bottom headless, with the command
notebooks/README.md gives (nbclient's ``jupyter execute``, kernel ``python3``), and is
committed without outputs; its executed copy is ignored by git."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import zreplay

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "inspect_buffer.ipynb"
EXECUTED = "inspect_buffer.executed.ipynb"  # the copy notebooks/README.md executes


def test_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)


def test_the_readme_commands_run_the_notebook_headless(tmp_path):
    readme = (ROOT / "notebooks" / "README.md").read_text()
    block = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    assert f"jupyter execute --inplace notebooks/{EXECUTED}" in block
    # The kernel is a child process: make it import this checkout's zreplay. The copy
    # lies in tmp_path, so the buffer it writes (beside the notebook) lands there.
    src = str(Path(zreplay.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    copy = tmp_path / EXECUTED
    shutil.copy(NOTEBOOK, copy)
    got = subprocess.run(
        [sys.executable, "-m", "jupyter", "execute", "--inplace", str(copy)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert got.returncode == 0, got.stderr[-3000:]
    assert zreplay.open(tmp_path / "inspect_buffer.zarr").num_episodes == 12
    nb = nbformat.read(copy, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2  # the two figures
    text = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)
    assert "segments" in text and "Crc32cCodec" in text and "n_rows" in text
    # What the notebook says about lengths: data arrays exactly the committed rows, index
    # arrays longer (grown ahead), their real entries the commit's counts.
    grown = re.search(r"episodes/length: \((\d+),\) \| real entries: 12\n", text)
    assert grown and int(grown.group(1)) > 12, text
    assert re.search(r"offsets: \((\d+),\) \| real entries: 13\n", text), text


def test_the_executed_copy_and_the_buffer_are_ignored_by_git():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    paths = [f"notebooks/{EXECUTED}", "notebooks/inspect_buffer.zarr/zarr.json"]
    got = subprocess.run(
        ["git", "check-ignore", "--no-index", *paths], cwd=ROOT, capture_output=True, text=True
    )
    assert got.stdout.split() == paths, got.stdout + got.stderr
