"""``notebooks/inspect_buffer.ipynb`` runs top to bottom (nbclient, kernel ``python3``) and
is committed without outputs."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

import zreplay

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "inspect_buffer.ipynb"


def test_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)


def test_notebook_runs(tmp_path, monkeypatch):
    # The kernel is a child process: make it import this checkout's zreplay, and run it
    # in tmp_path so the buffer it writes lands there, not in the repository.
    src = str(Path(zreplay.__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and traceback, on any error
    assert zreplay.open(tmp_path / "inspect_buffer.zarr").num_episodes == 12
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2  # the two figures
    text = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)
    assert "segments" in text and "Crc32cCodec" in text and "n_rows" in text
