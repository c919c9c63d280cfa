"""``zreplay plot PATH --out FILE.png``: episode returns and lengths, a reward histogram and
a few frames of each image key, drawn with matplotlib's Agg backend (no display needed).

The reward key is ``rewards`` (RLinf) or ``reward`` (stable-worldmodel); trailing
dimensions (RLinf's ``[C]`` action chunks) are summed per step.  Image keys are uint8 keys
with row shape ``(H, W)``, ``(H, W, 1)`` or ``(H, W, 3)``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import EmptyBufferError
from ..schema import flatten
from .output import EXIT_OK, Result, progress
from .paths import buffer_dir

REWARD_KEYS = ("rewards", "reward")
MAX_IMAGE_KEYS, FRAMES_PER_KEY = 3, 4


def is_image(spec) -> bool:
    shape = tuple(spec.row_shape)
    if spec.dtype != np.uint8 or len(shape) not in (2, 3) or min(shape[:2]) < 4:
        return False
    return len(shape) == 2 or shape[2] in (1, 3)


def episode_rewards(view, key: str, tick) -> list[np.ndarray]:
    """Per-step rewards ``[L]`` (float64, trailing dims summed) of every visible episode."""
    out = []
    for e in range(view.num_episodes):
        r = flatten(view.episode(e, keys=[key]))[key]
        out.append(r.reshape(len(r), -1).sum(axis=1, dtype=np.float64))
        tick(1)
    return out


def run(args) -> Result:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    import zreplay

    view = zreplay.open(buffer_dir(args.path))
    lengths = view.episode_table()["length"]
    n = len(lengths)
    if n == 0:
        raise EmptyBufferError(f"{view.path} holds no episodes; nothing to plot")
    reward_key = next((k for k in REWARD_KEYS if k in view.keys()), None)
    image_keys = [k for k in view.keys() if is_image(view.schema.specs[k])][:MAX_IMAGE_KEYS]
    rewards = []
    if reward_key is not None:
        with progress(args, n, "plot", "episode") as bar:
            rewards = episode_rewards(view, reward_key, bar.update)
    returns = np.array([r.sum() for r in rewards])

    fig = plt.figure(figsize=(13, 3.4 * (1 + len(image_keys))), layout="constrained")
    grid = fig.add_gridspec(1 + len(image_keys), 3 * FRAMES_PER_KEY)
    ax_ret, ax_len, ax_hist = (fig.add_subplot(grid[0, 4 * i : 4 * i + 4]) for i in range(3))
    ret_title = f"episode return (sum of {reward_key!r})" if reward_key else "episode return"
    for ax, values, title, color in (
        (ax_ret, returns, ret_title, "tab:blue"),
        (ax_len, lengths, "episode length", "tab:green"),
    ):
        if len(values):
            ax.plot(np.arange(n), values, ".-", lw=0.8, ms=3, color=color)
        else:
            ax.text(0.5, 0.5, f"no {' or '.join(REWARD_KEYS)} key", ha="center", va="center")
        ax.set_title(title)
        ax.set_xlabel("episode (oldest first)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if rewards:
        ax_hist.hist(np.concatenate(rewards), bins=50, color="tab:orange")
    ax_hist.set_title(f"per-step {reward_key!r}" if rewards else "reward histogram (no reward key)")

    positions = np.unique(np.linspace(0, view.num_rows - 1, FRAMES_PER_KEY).astype(np.int64))
    for r, key in enumerate(image_keys, start=1):
        frames = flatten(view.rows(positions, keys=[key]))[key]
        for j, (pos, frame) in enumerate(zip(positions, frames, strict=True)):
            ax = fig.add_subplot(grid[r, 3 * j : 3 * j + 3])
            gray = frame.ndim == 2 or frame.shape[-1] == 1
            ax.imshow(
                frame.reshape(frame.shape[:2]) if gray else frame,
                cmap="gray" if gray else None,
                vmin=0,
                vmax=255,
            )
            ax.set_title(f"{key} row {int(pos)}", fontsize=9)
            ax.axis("off")
    fig.suptitle(f"{view.path}: {n} episodes, {view.num_rows} rows")
    out = Path(args.out)
    fig.savefig(out, dpi=args.dpi)
    plt.close(fig)

    result = {
        "path": str(view.path),
        "out": str(out),
        "episodes": n,
        "reward_key": reward_key,
        "image_keys": image_keys,
        "mean_return": float(returns.mean()) if len(returns) else None,
        "mean_length": float(lengths.mean()),
    }
    text = f"wrote {out}: {n} episodes, mean length {result['mean_length']:.3g}"
    if result["mean_return"] is not None:
        text += f", mean return {result['mean_return']:.3g}"
    if image_keys:
        text += f", frames of {', '.join(image_keys)}"
    return EXIT_OK, result, text
