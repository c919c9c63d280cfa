"""Every code block of README.md (and of CONTRIBUTING.md) runs as pasted.

Each fenced block is one test: ``python`` blocks run as a script (``python block.py``) and
``bash`` blocks with ``bash -e``, each in a fresh directory, in a fresh process, with this
checkout's ``src`` first on ``PYTHONPATH`` and this interpreter's ``bin`` first on ``PATH``
(the ``zreplay`` command).  A block may say, in an HTML comment on the line(s) right
above its fence (invisible on GitHub), what it needs or why it cannot run here:

* ``<!-- readme-test: needs=NAME[,NAME...] -->``: the data the README's text says the
  block needs, from :data:`NEEDS` below (Python run before the block, under ``if __name__
  == "__main__":`` so that processes multiprocessing starts skip it: objects in the same
  script, files in the block's directory); ``s3`` also starts a real S3 endpoint (moto's
  server on 127.0.0.1) and hands its address and credentials to the block through the
  AWS environment variables, as a user's MinIO or AWS account would;
* ``<!-- readme-test: skip=REASON -->``: not run, reported as skipped with REASON (a
  block that installs packages, runs for minutes, or runs this suite);
* ``<!-- readme-test: not-code=REASON -->``: a listing, not a program (skipped, said so);
* ``<!-- readme-test: slow=REASON -->``: runs, but with the slow tests (``python -m pytest
  -m slow``, which ``.ci/run`` runs too), not in the README's quick test command.

A block with no comment runs as pasted; a block in another language, or with no
language, fails until it gets one of these comments: nothing is skipped silently.
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
DOCS = [README, ROOT / "CONTRIBUTING.md"]
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


# -- the data blocks say they need ------------------------------------------------------

TRAJECTORIES = """
import numpy as np
import zreplay

def _trajectory(tid, T=24, B=4, C=2, A=3):
    rng = np.random.default_rng(tid)
    flags = np.zeros((T, B, C), bool)
    flags[-1] = True  # every lane's episode ends with the trajectory
    return zreplay.Trajectory(
        actions=rng.standard_normal((T, B, C * A)).astype(np.float32),
        rewards=rng.random((T, B, C)).astype(np.float32),
        terminations=flags, truncations=np.zeros_like(flags), dones=flags.copy(),
        prev_logprobs=np.zeros((T, B, C * A), np.float32),
        curr_obs={"main_images": rng.integers(0, 255, (T, B, 16, 16, 3), dtype=np.uint8),
                  "states": rng.standard_normal((T, B, 8)).astype(np.float32)},
        next_obs={"main_images": rng.integers(0, 255, (T, B, 16, 16, 3), dtype=np.uint8),
                  "states": rng.standard_normal((T, B, 8)).astype(np.float32)},
        max_episode_length=T, model_weights_id=f"w{tid}",
    )

trajectories = [_trajectory(t) for t in range(4)]
"""

NEEDS: dict[str, str] = {
    # RLinf Trajectory objects (zreplay.Trajectory has the same fields).
    "trajectories": TRAJECTORIES,
    # A buffer of those at the path the README's examples use.
    "rlinf_buffer": TRAJECTORIES
    + """
_buf = zreplay.TrajectoryReplayBuffer(auto_save=True,
                                      auto_save_path="runs/exp1/replay_buffer/rank_0")
_buf.add_trajectories(trajectories)
_buf.close()
""",
    # stable-worldmodel episodes, as World.collect writes them.
    "episodes": """
import numpy as np

episodes = [
    {"pixels": np.random.default_rng(i).integers(0, 255, (20, 16, 16, 3), dtype=np.uint8),
     "action": np.random.default_rng(i).standard_normal((20, 2)).astype(np.float32),
     "reward": np.ones(20, np.float32), "terminated": np.arange(20) == 19}
    for i in range(3)
]
""",
    # An Atari-style TrajectoryReplayBuffer and a target network.
    "atari_buffer": """
import numpy as np
import torch
import zreplay

buf = zreplay.TrajectoryReplayBuffer()
_rng = np.random.default_rng(0)
for _ in range(3):
    _T, _B = 50, 2
    _flags = _rng.random((_T, _B)) < 0.05
    buf.add_trajectories([{
        "obs": _rng.integers(0, 255, (_T, _B, 84, 84), dtype=np.uint8),
        "actions": _rng.integers(0, 6, (_T, _B)),
        "rewards": _rng.random((_T, _B)).astype(np.float32),
        "terminations": _flags, "truncations": np.zeros_like(_flags),
    }])
_net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(6))
q_target = lambda obs: _net(obs.float() / 255)
""",
    # A Q-network and its target, for the prioritized-replay loss.
    "q_functions": """
import torch
q = lambda batch: batch["rewards"].sum(-1)
target = lambda batch: torch.zeros(len(batch["rewards"]))
""",
    # A TensorDict batch with trajectory ids, as a TorchRL collector gives it.
    "tensordict_batch": """
import torch
from tensordict import TensorDict

_n = 2_000
tensordict_batch = TensorDict({
    "episode": torch.arange(_n) // 100,
    "pixels": torch.randint(0, 255, (_n, 16, 16, 3), dtype=torch.uint8),
    "action": torch.randn(_n, 4),
    ("next", "reward"): torch.randn(_n, 1),
    ("next", "done"): (torch.arange(_n) % 100 == 99).unsqueeze(-1),
}, batch_size=[_n])
""",
    # A torch.distributed process group (one rank, gloo), made by the script itself.
    "process_group": """
import os
import socket

import torch.distributed as dist

with socket.socket() as _s:
    _s.bind(("127.0.0.1", 0))
    os.environ.setdefault("MASTER_PORT", str(_s.getsockname()[1]))
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
dist.init_process_group("gloo", rank=0, world_size=1)
""",
    "s3": "",  # the endpoint: see s3_env()
}

# Files a ``bash`` block needs come from the same code, run by python first.


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


ALL = [b for d in DOCS for b in blocks(d.read_text(), d.stem)]


def test_the_readme_has_blocks_and_every_need_is_known():
    assert len(ALL) >= 10
    for b in ALL:
        for name in filter(None, b.marks.get("needs", "").replace(" ", "").split(",")):
            assert name in NEEDS, f"{b.doc} line {b.line}: unknown need {name!r} (see NEEDS)"


@pytest.mark.parametrize(
    "block",
    [pytest.param(b, marks=[pytest.mark.slow] if "slow" in b.marks else []) for b in ALL],
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
    needs = [n for n in block.marks.get("needs", "").replace(" ", "").split(",") if n]
    # Made once, by the script itself: not again in the processes multiprocessing starts
    # (they import the script as __mp_main__).
    setup = "\n".join(textwrap.dedent(NEEDS[n]) for n in needs).strip()
    setup = f"if __name__ == '__main__':\n{textwrap.indent(setup, '    ')}\n" if setup else ""
    env = request.getfixturevalue("s3_env") if "s3" in needs else {}
    if block.lang == "python":
        script = tmp_path / "block.py"
        script.write_text(setup + f"\n# --- the {block.doc} block, as pasted ---\n" + block.code)
        got = run([sys.executable, str(script)], tmp_path, env)
    else:
        if setup:
            (tmp_path / "setup.py").write_text(setup)
            made = run([sys.executable, "setup.py"], tmp_path, env)
            assert made.returncode == 0, made.stderr[-4000:]
        got = run(["bash", "-e", "-c", block.code], tmp_path, env)
    assert got.returncode == 0, (
        f"{block.doc} block at line {block.line} failed (exit {got.returncode}); make it run as "
        f"pasted or declare what it needs (see {Path(__file__).name})\n"
        f"--- stdout ---\n{got.stdout[-3000:]}\n--- stderr ---\n{got.stderr[-6000:]}"
    )


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
