"""Every code block of README.md, CONTRIBUTING.md and the docs site's pages runs as pasted.

Each fenced block is one test: ``python`` blocks run as a script (``python block.py``) and
``bash`` blocks with ``bash -e``, each alone in a fresh, empty directory, in a fresh
process, with this checkout's ``src`` first on ``PYTHONPATH`` and this interpreter's
``bin`` first on ``PATH`` (the ``zreplay`` command).  Blocks build their own inputs.  A
block may say, in an HTML comment on the line(s) right above its fence (invisible on
GitHub and on the site), what it needs or why it cannot run here:

* ``<!-- readme-test: needs=s3 -->``: a real S3 endpoint (moto's server on 127.0.0.1 with
  a bucket named ``bucket``), handed to the block through the AWS environment variables,
  as a user's MinIO or AWS account would be;
* ``<!-- readme-test: needs=lerobot -->``: LeRobot's own code, which the project's venv
  cannot hold: the block runs with the judge venv's interpreter
  (``ZREPLAY_LEROBOT_PYTHON``, tests/lerobot_judge.py), offline, in the slow set, and is
  skipped with that reason when the variable is unset;
* ``<!-- readme-test: skip=REASON -->``: not run, reported as skipped with REASON (a
  block that installs packages, runs for minutes, or runs this suite);
* ``<!-- readme-test: not-code=REASON -->``: a listing or a diagram, not a program
  (skipped, said so);
* ``<!-- readme-test: slow=REASON -->``: runs, but with the slow tests (``python -m pytest
  -m slow``, which ``.ci/run`` runs too), not in the README's quick test command.

A block with no comment runs as pasted; a block in another language, or with no
language, fails until it gets one of these comments: nothing is skipped silently.  Docs
pages include README.md's examples and the root FORMAT.md / CONTRIBUTING.md with
``pymdownx.snippets`` (``--8<--``) rather than copying them, so each block runs once, where
it is written.  The README's blocks also run a second time in the same directory (slow
set): running an example twice must work.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SITE = ROOT / "docs"
# docs/format.md only includes FORMAT.md; its recipes that read a buffer of the user's
# run in the tests they name (test_view, test_episodes, test_samplers).
DOCS = [README, ROOT / "CONTRIBUTING.md", ROOT / "FORMAT.md", *sorted(SITE.rglob("*.md"))]
README_MAX_LINES = 300
TIMEOUT_S = 600
MARK = re.compile(r"<!--\s*readme-test:\s*(needs|skip|not-code|slow)\s*=\s*(.*?)\s*-->", re.S)


@dataclass
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marks: dict[str, str]
    doc: str = "README"

    @property
    def id(self) -> str:
        first = next((x for x in self.code.splitlines() if x.strip()), "")[:40]
        where = "" if self.doc == "README" else f"{self.doc}:"
        return f"{where}L{self.line}:{self.lang or 'plain'}:{first}"

    @property
    def runs(self) -> bool:
        return not ({"skip", "not-code"} & set(self.marks))


def blocks(text: str, doc: str = "README") -> list[Block]:
    """The fenced blocks of ``text`` with the readme-test comments just above them."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^(\s*)(```+)(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        code = textwrap.dedent("\n".join(x[len(indent) :] for x in lines[i + 1 : j]))
        above, k = [], i - 1
        while k >= 0 and lines[k].strip().startswith("<!--"):
            above.insert(0, lines[k])
            k -= 1
        marks = {key: value for key, value in MARK.findall("\n".join(above))}
        out.append(Block(i + 1, lang.lower(), code + "\n", marks, doc))
        i = j + 1
    return out


# -- what a block may need ------------------------------------------------------------

# Blocks build their own inputs; what a block cannot build is an S3 endpoint, which
# s3_env() provides as a user's environment would, and LeRobot's own code (its venv).
NEEDS = {"s3", "lerobot"}


@pytest.fixture(scope="module")
def s3_env():
    """moto's S3 server on 127.0.0.1 with a bucket named ``bucket``, as AWS variables."""
    moto_server = pytest.importorskip("moto.server")
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    import s3fs

    s3fs.S3FileSystem(endpoint_url=env["AWS_ENDPOINT_URL"], key="testing", secret="testing").mkdir(
        "bucket"
    )
    yield env
    server.stop()


def run(argv: list[str], cwd: Path, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTEST"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["MPLBACKEND"] = "Agg"
    env.update(extra_env or {})
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def doc_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return rel.as_posix() if rel.parts[0] == "docs" else rel.name


ALL = [b for d in DOCS for b in blocks(d.read_text(), doc_name(d))]


def needs(block: Block) -> list[str]:
    return [n for n in block.marks.get("needs", "").replace(" ", "").split(",") if n]


def test_the_readme_has_blocks_and_every_need_is_known():
    assert len(ALL) >= 10
    assert any(b.doc.startswith("docs/") for b in ALL), "no docs page was read"
    for b in ALL:
        for name in needs(b):
            assert name in NEEDS, (
                f"{b.doc} line {b.line}: needs={name!r}: a block builds its own inputs "
                "(only an S3 endpoint, needs=s3, and LeRobot's venv, needs=lerobot, are "
                "provided)"
            )


def run_block(
    block: Block, tmp_path: Path, env: dict, python: str = sys.executable
) -> subprocess.CompletedProcess:
    """Run ``block`` in ``tmp_path/work`` (made empty the first time), the script beside it."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    if block.lang == "python":
        script = tmp_path / "block.py"
        script.write_text(block.code)
        return run([python, str(script)], work, env)
    return run(["bash", "-e", "-c", block.code], work, env)


def lerobot_python(block: Block, tmp_path: Path) -> tuple[str, dict]:
    """The judge venv's interpreter and environment for a ``needs=lerobot`` block."""
    from lerobot_judge import JUDGE_PYTHON, JUDGES, judge_env

    if JUDGE_PYTHON is None:
        pytest.skip(
            f"{block.doc} line {block.line} needs LeRobot's own code: build its venv with "
            "`.ci/lerobot-env DIR` and set ZREPLAY_LEROBOT_PYTHON=DIR/bin/python"
        )
    env = judge_env(tmp_path)
    # this checkout first, then the test-only torchvision stand-in LeRobot imports
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(JUDGES)])
    env["PATH"] = os.pathsep.join([str(Path(JUDGE_PYTHON).parent), os.environ.get("PATH", "")])
    return JUDGE_PYTHON, {
        k: env[k] for k in ("HF_HUB_OFFLINE", "HF_HOME", "HF_DATASETS_CACHE", "PYTHONPATH", "PATH")
    }


def check(got: subprocess.CompletedProcess, block: Block, what: str = "") -> None:
    assert got.returncode == 0, (
        f"{block.doc} block at line {block.line} failed{what} (exit {got.returncode}); make it "
        f"run as pasted, alone, in an empty directory (see {Path(__file__).name})\n"
        f"--- stdout ---\n{got.stdout[-3000:]}\n--- stderr ---\n{got.stderr[-6000:]}"
    )


@pytest.mark.parametrize(
    "block",
    [
        pytest.param(
            b, marks=[pytest.mark.slow] if "slow" in b.marks or "lerobot" in needs(b) else []
        )
        for b in ALL
    ],
    ids=[b.id for b in ALL],
)
def test_readme_block_runs_as_pasted(block: Block, tmp_path, request):
    if "skip" in block.marks:
        pytest.skip(f"{block.doc} line {block.line}: {block.marks['skip']}")
    if "not-code" in block.marks:
        pytest.skip(f"{block.doc} line {block.line} is not a program: {block.marks['not-code']}")
    assert block.lang in ("python", "bash"), (
        f"{block.doc} line {block.line}: a ```{block.lang or ''} block; give it a language (python "
        "or bash) or a <!-- readme-test: skip=... / not-code=... --> comment"
    )
    if "lerobot" in needs(block):
        python, env = lerobot_python(block, tmp_path)
        check(run_block(block, tmp_path, env, python), block)
        return
    env = request.getfixturevalue("s3_env") if "s3" in needs(block) else {}
    check(run_block(block, tmp_path, env), block)


AGAIN = [b for b in ALL if b.doc == "README" and b.runs]


@pytest.mark.slow
@pytest.mark.parametrize("block", AGAIN, ids=[b.id for b in AGAIN])
def test_readme_block_runs_twice_in_the_same_directory(block: Block, tmp_path, request):
    """Users paste an example again (or the next one beside it): a second run in the same
    directory must work too (e.g. TorchRL's resumed storage, RLinf's export target)."""
    env = request.getfixturevalue("s3_env") if "s3" in needs(block) else {}
    check(run_block(block, tmp_path, env), block)
    check(run_block(block, tmp_path, env), block, " when run a second time in the same directory")


def test_readme_is_short():
    """The README is the first screen and the ways in; everything else is on the docs site."""
    n = len(README.read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES})"


def test_docs_pages_are_in_the_site_and_link_no_missing_page():
    """Every docs page is in mkdocs.yml's nav, and every nav entry exists (mkdocs build
    --strict, which .ci/run runs, checks the links and snippet includes)."""
    nav = set(
        re.findall(
            r":\s*([\w/.-]+\.md)\s*$|^\s*-\s*([\w/.-]+\.md)\s*$",
            (ROOT / "mkdocs.yml").read_text(),
            re.M,
        )
    )
    listed = {a or b for a, b in nav}
    pages = {p.relative_to(SITE).as_posix() for p in SITE.rglob("*.md")}
    assert listed == pages, (sorted(pages - listed), sorted(listed - pages))


def test_no_document_points_outside_the_repository():
    """The project carries its own design: nothing it ships points into the developers'
    shared folder (``../shared``, or its absolute path), which users do not have."""
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    found = []
    for name in tracked:
        path = ROOT / name
        if path.suffix not in (".md", ".py", ".toml", ".ipynb", ".txt", "") or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if name != "tests/test_readme.py" and ("../shared" in text or "/work/shared" in text):
            found.append(name)
    assert not found, found
