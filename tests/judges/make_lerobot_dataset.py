"""Judge script (runs in the LeRobot venv): write a LeRobot v3.0 dataset with LeRobot's own
writer (``LeRobotDataset.create`` / ``add_frame`` / ``save_episode`` / ``finalize``).

    make_lerobot_dataset.py ROOT [--episodes N] [--data-mb MB] [--video-mb MB] [--chunks-size K]

Real frames: scikit-image's astronaut photo, panned, for the ``observation.images.front``
video camera (AV1, LeRobot's default), its coffee photo, panned, for the
``observation.images.wrist`` image camera (PNG in the parquet), and Breakout's screen
(ale-py's emulator, ROM shipped with ale-py, a new game each episode) for the
``observation.images.atari`` video camera; state, action,
``next.reward``, ``next.done`` and three tasks.  Small file sizes make data and video
files roll over (several episodes per file, several files and chunks).
"""

import argparse

import ale_py
import numpy as np
import skimage.data
from lerobot.datasets.lerobot_dataset import LeRobotDataset

TASKS = ["pick up the cube", "place the cube in the bowl", "push the button"]
FRONT, WRIST, ATARI = (64, 96, 3), (48, 64, 3), (210, 160, 3)


class Atari:
    """Breakout's RGB screen as an agent pressing through the minimal action set sees it."""

    def __init__(self, seed: int):
        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
        self.ale = ale_py.ALEInterface()
        self.ale.setInt("random_seed", seed)
        self.ale.loadROM(ale_py.roms.get_rom_path("breakout"))
        self.actions = self.ale.getMinimalActionSet()

    def episode(self, rng: np.random.Generator):
        self.ale.reset_game()
        while True:
            self.ale.act(self.actions[int(rng.integers(len(self.actions)))])
            yield self.ale.getScreenRGB()


def features() -> dict:
    frame = ["height", "width", "channels"]
    return {
        "observation.images.front": {"dtype": "video", "shape": FRONT, "names": frame},
        "observation.images.wrist": {"dtype": "image", "shape": WRIST, "names": frame},
        "observation.images.atari": {"dtype": "video", "shape": ATARI, "names": frame},
        "observation.state": {"dtype": "float32", "shape": (6,), "names": None},
        "action": {"dtype": "float32", "shape": (2,), "names": None},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
        "next.done": {"dtype": "bool", "shape": (1,), "names": None},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--episodes", type=int, default=7)
    ap.add_argument("--data-mb", type=float, default=0.02)
    ap.add_argument("--video-mb", type=float, default=0.02)
    ap.add_argument("--chunks-size", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    photo, coffee = skimage.data.astronaut(), skimage.data.coffee()
    atari = Atari(a.seed)
    ds = LeRobotDataset.create("zreplay/judge", fps=10, features=features(), root=a.root)
    ds.meta.update_chunk_settings(
        chunks_size=a.chunks_size,
        data_files_size_in_mb=a.data_mb,
        video_files_size_in_mb=a.video_mb,
    )
    for ep in range(a.episodes):
        length = int(rng.integers(5, 14))
        ends_done = ep % 3 != 1  # every third episode is cut short (truncated)
        y0, x0 = int(rng.integers(0, 300)), int(rng.integers(0, 300))
        screens = atari.episode(rng)
        for t in range(length):
            y, x = y0 + 4 * t, x0 + 3 * t
            ds.add_frame(
                {
                    "observation.images.front": photo[y : y + FRONT[0], x : x + FRONT[1]],
                    "observation.images.wrist": coffee[y : y + WRIST[0], x : x + WRIST[1]],
                    "observation.images.atari": next(screens),
                    "observation.state": rng.standard_normal(6).astype(np.float32),
                    "action": rng.uniform(-1, 1, 2).astype(np.float32),
                    "next.reward": np.array([rng.uniform()], np.float32),
                    "next.done": np.array([ends_done and t == length - 1]),
                    "task": TASKS[ep % len(TASKS)],
                }
            )
        ds.save_episode()
    ds.finalize()
    print(f"wrote {a.episodes} episodes to {a.root}")


if __name__ == "__main__":
    main()
