"""docs/benchmarks.md's table of current figures is what ``benchmarks/report.py`` makes
of the committed JSON results: one row per figure, each naming its commit and file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import benchlib  # noqa: E402
import report  # noqa: E402


def _full_history() -> bool:
    got = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"],
        capture_output=True,
        text=True,
        check=False,
    )
    return got.returncode == 0 and got.stdout.strip() == "false"


def test_the_docs_table_is_the_reports_output():
    if not _full_history():
        pytest.skip("report.py orders runs by their commits' dates: needs the git history")
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    shown = doc.split(report.START, 1)[1].split(report.END, 1)[0].strip()
    assert shown == report.table(report.current()), (
        "docs/benchmarks.md is stale: run python benchmarks/report.py --write docs/benchmarks.md"
    )


def test_each_row_names_the_commit_and_file_it_came_from():
    rows = report.current()
    assert {r["benchmark"] for r in rows} >= {"foundation", "peers", "clips", "torchrl", "s3"}
    for r in rows:
        data = json.loads((ROOT / r["file"]).read_text())
        head = ((data.get("machine") or {}).get("git") or {}).get("head") or ""
        assert r["commit"] == (head[:7] or "not recorded"), r
        assert "before" not in Path(r["file"]).name and not Path(r["file"]).name.startswith("ab-")
    assert len({(r["benchmark"], r["figure"]) for r in rows}) == len(rows)  # one row a figure


def test_new_runs_record_commit_time_and_machine():
    info = benchlib.machine_info()
    assert info["time"] and info["cpu_model"] and info["cores"] >= 1
    assert "head" in info["git"]
    assert report._run_time(info["time"]) > 0
