"""What a new user meets in the first hour: a DataLoader script without the
``__main__`` guard, ``device="cuda"`` without CUDA, float64 images, ``with`` and ``repr``."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import textwrap
import traceback
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import zreplay
from zreplay.errors import DeviceUnavailableError

SRC = str(Path(__file__).resolve().parents[1] / "src")
CACHE_DIR = os.environ["ZREPLAY_CACHE_DIR"]  # set by conftest

SCRIPT = """
import sys
import numpy as np
import torch
import zreplay

def main():
    rb = zreplay.ReplayBuffer(max_steps=1000, path=sys.argv[1])
    rb.write_episode({"obs": np.zeros((10, 3), np.float32)})
    loader = torch.utils.data.DataLoader(rb, batch_size=4, num_workers=1,
                                         multiprocessing_context="spawn")
    print("batches", sum(1 for _ in loader))
    rb.close()
"""


def run_script(tmp_path: Path, body: str, name: str) -> subprocess.CompletedProcess:
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(SCRIPT) + body)
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path / name)],
        capture_output=True,
        text=True,
        timeout=300,
        # (conftest's column cache directory: not the user's ~/.cache)
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin", "ZREPLAY_CACHE_DIR": CACHE_DIR},
    )


def test_a_spawned_worker_rerunning_the_script_says_so(tmp_path):
    got = run_script(tmp_path, "\nmain()\n", "unguarded")  # no `if __name__ == ...`
    assert got.returncode != 0
    assert "MainGuardError" in got.stderr, got.stderr[-3000:]
    assert 'if __name__ == "__main__":' in got.stderr
    assert "WriterLockedError" not in got.stderr
    guarded = run_script(tmp_path, '\nif __name__ == "__main__":\n    main()\n', "guarded")
    assert guarded.returncode == 0, guarded.stderr[-3000:]
    assert "batches 3" in guarded.stdout


def filled(path=None):
    buf = zreplay.TrajectoryReplayBuffer(auto_save=path is not None, auto_save_path=path or "")
    buf.add_trajectories([{"obs": np.zeros((4, 2, 3), np.float32), "rewards": np.zeros((4, 2))}])
    return buf


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the error without a CUDA device; this one has one"
)
def test_cuda_without_cuda_is_one_error_on_the_callers_line():
    buf = filled()
    for call in (
        lambda: buf.sample(8, device="cuda"),
        lambda: buf.sample(8, device="cuda", pin_memory=True),
        lambda: buf.sample_chunks(8, device="cuda:0"),
        lambda: buf.prefetch(8, device="cuda"),
    ):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with pytest.raises(DeviceUnavailableError, match="device='cuda") as err:
                call()
        assert seen == []  # no "falls back" warning first
        assert isinstance(err.value, RuntimeError) and "device=None" in str(err.value)
        frames = traceback.extract_tb(err.value.__traceback__)
        # the raising frame is the buffer method the caller's line called
        assert frames[-1].filename.endswith("trajectory_buffer.py")
        assert frames[-2].filename == __file__
    buf.close()


def test_float64_images_warn_once_on_the_callers_line(tmp_path):
    frames = np.zeros((3, 2, 84, 84, 3))  # float64
    buf = zreplay.TrajectoryReplayBuffer()
    with pytest.warns(
        UserWarning, match=r"float64 images .*'obs' \(84, 84, 3\).*astype\(np.uint8\)"
    ) as w:
        line = inspect.currentframe().f_lineno + 1
        buf.add_trajectories([{"obs": frames, "rewards": np.zeros((3, 2), np.float32)}])
    assert [(Path(x.filename).name, x.lineno) for x in w] == [("test_first_hour.py", line)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: the schema is fixed now
        buf.add_trajectories([{"obs": frames, "rewards": np.zeros((3, 2), np.float32)}])
    buf.close()

    rb = zreplay.ReplayBuffer(100)
    with pytest.warns(UserWarning, match="float64 images") as w:
        line = inspect.currentframe().f_lineno + 1
        rb.write_episodes([{"pixels": np.zeros((5, 3, 32, 32))}])  # CHW counts too
    assert [(Path(x.filename).name, x.lineno) for x in w] == [("test_first_hour.py", line)]
    rb.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not images: no warning
        zreplay.ReplayBuffer(10).write_episode({"obs": np.zeros((5, 84, 84))})


def test_with_closes_a_trajectory_buffer_and_commits_a_replay_buffer(tmp_path):
    with filled(str(tmp_path / "t")) as buf:
        pass
    assert buf.core.closed and "closed" in repr(buf)
    with zreplay.ReplayBuffer(100, path=tmp_path / "r") as rb:
        rb.write_episode({"obs": np.zeros((4, 2), np.float32)})
    assert not rb.core.closed  # stable-worldmodel's World.collect re-enters it
    assert zreplay.open(tmp_path / "r").num_rows == 4  # committed on exit
    with rb:
        rb.write_episode({"obs": np.ones((3, 2), np.float32)})
    assert rb.num_episodes == 2
    with pytest.raises(KeyError), rb:
        raise KeyError("the body's error propagates, nothing hides it")
    rb.close()


def test_reprs_say_what_is_inside(tmp_path):
    buf = filled(str(tmp_path / "t"))
    assert repr(buf) == (
        f"TrajectoryReplayBuffer({tmp_path / 't'}: 1 trajectories, 8 rows, "
        "sampler=Window(size=100), keys=[obs, rewards])"
    )
    buf.close()
    rb = zreplay.ReplayBuffer(100, history_len=2)
    rb.write_episode({"obs": np.zeros((4, 2), np.float32)})
    assert repr(rb).startswith(
        "ReplayBuffer(episodes=1, steps=4/100, history_len=2, frameskip=1, columns=[obs]"
    )
    rb.close()


def test_forked_dataloader_workers_warn_once_from_the_users_line(tmp_path):
    """Under the default fork context every worker reads through zarr-python; the
    warning that says so comes once per program (not once per worker), attributed to a
    line outside zreplay rather than to zreplay's own store module."""
    script = tmp_path / "fork_loader.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, numpy as np, torch, zreplay
            path = {str(tmp_path / "buf")!r}
            with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path) as b:
                b.add_trajectories([{{"obs": np.zeros((8, 4, 3), np.float32),
                                      "rewards": np.ones((8, 4), np.float32)}}])
            view = zreplay.open(path)
            loader = torch.utils.data.DataLoader(
                view, batch_size=4, num_workers=3, multiprocessing_context="fork")
            assert sum(len(x["obs"]) for x in loader) == 32
            print(os.path.dirname(os.path.realpath(zreplay.__file__)))
            """
        )
    )
    got = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert got.returncode == 0, got.stderr[-3000:]
    lines = [x for x in got.stderr.splitlines() if "reading in a forked process" in x]
    assert len(lines) == 1, got.stderr[-3000:]
    # The warning line reads "<file>:<line>: UserWarning: ..."; compare that file with
    # zreplay's package directory itself, not with a substring such as "zreplay/", which
    # the checkout's own folder name (or a .venv inside it) may contain.
    where = re.match(r"(.+?):(\d+): \w+: ", lines[0])
    assert where, lines[0]
    package = got.stdout.strip().splitlines()[-1]
    filename = os.path.realpath(where.group(1))
    assert os.path.isfile(filename), lines[0]
    assert os.path.commonpath([filename, package]) != package, (filename, package)
