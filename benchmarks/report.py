"""The current benchmark table, regenerated from the JSON results.

    python benchmarks/report.py                          # print the table (markdown)
    python benchmarks/report.py --write docs/benchmarks.md   # replace it between the markers

Reads every ``benchmarks/results/**/*.json``; for each figure keeps the newest run that has
it, newest meaning the run's recorded commit is the latest in git history (``time`` in
``machine`` when a run recorded one). Runs of an older version on purpose (``before`` in
the file name) and A/B comparisons (``ab-*``: two versions in one run) are history, not
current figures: see ``docs/benchmarks-history.md``. Each row names the commit and the
JSON file it came from, and the machine (CPU, cores) that ran it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
START, END = "<!-- report.py: start -->", "<!-- report.py: end -->"


def _t(seconds) -> str:
    if not isinstance(seconds, int | float):
        return str(seconds)
    for unit, scale in (("s", 1), ("ms", 1e3), ("us", 1e6)):
        if abs(seconds) >= 1 / scale or unit == "us":
            return f"{seconds * scale:.3g} {unit}"
    raise AssertionError("unreachable")


def _num(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _ratio(v) -> str:
    return "" if not isinstance(v, int | float) else f"{v:.2f}x"


def _benchmark(path: Path, data: dict) -> str:
    name = data.get("benchmark") or path.relative_to(RESULTS).parts[0]
    name = re.sub(r"\.json$", "", str(name)).removeprefix("bench_")
    return {"io": "io", "rerun-b79c262": path.stem}.get(name, name.split("-")[0])


def _rows(bench: str, d: dict):
    """``(figure, zreplay, compared with)`` for each figure of one run."""
    if isinstance(d.get("rows"), list):  # benchlib tables: foundation, clips
        for r in d["rows"]:
            if not isinstance(r, dict) or "figure" not in r:
                continue
            z = r.get("zreplay", r.get("system", ""))
            if r.get("median") is not None and not r.get("zreplay"):
                z = f"{r.get('system', '')} {_t(r['median'])}".strip()
            peer = r.get("peer") or r.get("vs") or ""
            yield r["figure"], str(z), f"{peer} {_ratio(r.get('ratio'))}".strip()
    if isinstance(d.get("targets"), list):  # peers
        for t in d["targets"]:
            yield (
                f"({t.get('workload')}) {t.get('target')}",
                _num(t.get("value")),
                f"target {t.get('limit')}: {t.get('status')}",
            )
    if isinstance(d.get("table_markdown"), str):  # torchrl
        lines = [x for x in d["table_markdown"].splitlines() if x.startswith("|")]
        head = [c.strip() for c in lines[0].strip("|").split("|")]
        for line in lines[2:]:
            cells = dict(zip(head, (c.strip() for c in line.strip("|").split("|")), strict=False))
            peers = ", ".join(
                f"{k} {cells[k]}" for k in ("LazyTensorStorage", "LazyMemmapStorage") if k in cells
            )
            yield f"{cells['workload']}: {cells['figure']}", cells.get("ZarrStorage", ""), peers
    if isinstance(d.get("table"), list) and bench == "priority":
        for line in d["table"][2:]:
            if line.strip():
                name, _, rest = line.partition("  ")
                yield f"PER: {name.strip()}", " ".join(rest.split()), ""
    if isinstance(d.get("ratios_zreplay_over_torchrl"), dict):  # scale
        for fig, by_size in d["ratios_zreplay_over_torchrl"].items():
            sizes = " / ".join(f"{k} {_ratio(v)}" for k, v in by_size.items())
            yield f"{fig}, zreplay / TorchRL memmap", sizes, "TorchRL LazyMemmapStorage"
    if isinstance(d.get("servers"), list):  # s3
        for s in d["servers"]:
            lat = s.get("latency_ms")
            med = (s.get("s3_sample") or {}).get("median_ms")
            fetch = (s.get("fetch_all_obstore") or {}).get("median_ms")
            yield (
                f"S3 (moto, +{lat} ms latency): sample(256) median",
                _t(med / 1e3) if isinstance(med, int | float) else "",
                f"fetch every shard {_t(fetch / 1e3)}" if isinstance(fetch, int | float) else "",
            )
    if bench == "cuda" and isinstance(d.get("results"), list):
        for r in d["results"]:
            yield (
                f"CUDA {r.get('tier')} tier, {r.get('size')}x{r.get('size')}, n={r.get('n')}: "
                "train step with prefetch",
                f"{_num(r.get('prefetch_ms'))} ms",
                f"synchronous {_num(r.get('sync_loop_ms'))} ms",
            )
    if isinstance(d.get("summary"), dict):  # add, io
        for system, v in d["summary"].items():
            if isinstance(v, dict):
                for k, x in v.items():
                    if isinstance(x, int | float):
                        shown = _t(x) if k.endswith("_s") else _num(x)
                        yield f"{system}: {k}", shown, ""
            elif isinstance(v, int | float):
                yield system, _num(v), ""


def _commit_time(head: str | None, cache: dict) -> int:
    if not head:
        return 0
    if head not in cache:
        got = subprocess.run(
            ["git", "-C", str(HERE.parent), "show", "-s", "--format=%ct", head],
            capture_output=True,
            text=True,
            check=False,
        )
        cache[head] = int(got.stdout.strip() or 0) if got.returncode == 0 else 0
    return cache[head]


def _run_time(iso) -> int:
    """Seconds since the epoch of a run's recorded ``machine.time`` (0: none recorded)."""
    try:
        return int(dt.datetime.fromisoformat(iso).timestamp()) if iso else 0
    except (TypeError, ValueError):
        return 0


def current() -> list[dict]:
    """The newest value of every figure, each with its run's commit, machine and file."""
    best: dict[tuple[str, str], dict] = {}
    times: dict = {}
    for path in sorted(RESULTS.rglob("*.json")):
        rel = path.relative_to(HERE.parent).as_posix()
        if "before" in path.name or path.name.startswith("ab-"):
            continue
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(d, dict):
            continue
        machine = d.get("machine") if isinstance(d.get("machine"), dict) else {}
        head = (machine.get("git") or {}).get("head") or ""
        when = _run_time(machine.get("time")) or _commit_time(head, times)
        where = machine.get("cpu_model") or machine.get("device") or "?"
        cores = machine.get("cores") or machine.get("cpus")
        bench = _benchmark(path, d)
        for figure, z, peer in _rows(bench, d):
            key = (bench, figure)
            row = dict(
                benchmark=bench,
                figure=figure,
                zreplay=z,
                peer=peer,
                commit=head[:7] or "not recorded",
                machine=f"{where}, {cores} cores" if cores else where,
                file=rel,
                when=when,
            )
            if key not in best or (row["when"], rel) > (best[key]["when"], best[key]["file"]):
                best[key] = row
    return sorted(best.values(), key=lambda r: (r["benchmark"], r["file"]))


def table(rows: list[dict]) -> str:
    def cell(s: str) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    out = [
        "| benchmark | figure | zreplay | compared with | commit | machine | JSON |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            "| "
            + " | ".join(
                cell(r[k]) for k in ("benchmark", "figure", "zreplay", "peer", "commit", "machine")
            )
            + f" | `{r['file']}` |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--write", type=Path, help="markdown file whose table (between the markers) to replace"
    )
    args = ap.parse_args(argv)
    text = table(current())
    if args.write is None:
        print(text)
        return 0
    doc = args.write.read_text()
    if START not in doc or END not in doc:
        print(f"{args.write}: no {START} ... {END} markers", file=sys.stderr)
        return 1
    head, rest = doc.split(START, 1)
    args.write.write_text(f"{head}{START}\n{text}\n{END}{rest.split(END, 1)[1]}")
    print(f"wrote {len(text.splitlines()) - 2} rows to {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
