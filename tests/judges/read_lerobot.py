"""Judge script (runs in the LeRobot venv): every item of a LeRobot dataset as LeRobot's own
reader returns it, ``LeRobotDataset(repo_id, root=ROOT, video_backend="pyav")[i]``.

    read_lerobot.py ROOT OUT.npz

OUT.npz holds one array per feature, items stacked in order: frames (LeRobot returns
float32 [C, H, W] in [0, 1]) as uint8 [H, W, C] (x * 255, rounded), everything else as
returned; plus ``__episode_lengths__``, ``__episode_tasks__`` (JSON) and ``__tasks__``
(task strings by task_index, JSON).
"""

import json
import sys

import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset


def main() -> None:
    root, out = sys.argv[1], sys.argv[2]
    ds = LeRobotDataset("zreplay/judge", root=root, video_backend="pyav")
    frames = [k for k, f in ds.meta.features.items() if f["dtype"] in ("video", "image")]
    cols: dict[str, list] = {}
    for i in range(len(ds)):
        item = ds[i]
        for k, v in item.items():
            if k == "task":
                continue
            a = v.numpy()
            if k in frames:
                a = np.round(a * 255).astype(np.uint8).transpose(1, 2, 0)
            cols.setdefault(k, []).append(a)
    arrays = {k: np.stack(v) for k, v in cols.items()}
    eps = ds.meta.episodes
    tasks = sorted(ds.meta.tasks.index, key=lambda t: int(ds.meta.tasks.loc[t, "task_index"]))
    arrays["__episode_lengths__"] = np.asarray(eps["length"], np.int64)
    arrays["__episode_tasks__"] = np.array(json.dumps([list(t) for t in eps["tasks"]]))
    arrays["__tasks__"] = np.array(json.dumps(tasks))
    np.savez(out, **arrays)
    print(json.dumps({"items": len(ds), "episodes": len(eps["length"])}))


if __name__ == "__main__":
    main()
