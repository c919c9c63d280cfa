"""``zreplay plot PATH [--out FILE.png]``: episode returns (each episode coloured by how
it ended, with a moving average), lengths, a histogram of lengths and one of per-step
rewards, and a few frames of each image key, drawn with matplotlib's Agg backend (no
display needed).  ``--out`` defaults to ``<buffer name>.png`` in the current directory.

Rewards: see :mod:`zreplay.cli.rewards`.  Image keys are uint8 keys with row shape
``(H, W)``, ``(H, W, 1)`` or ``(H, W, 3)``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..conventions import REWARD_KEYS
from ..errors import EmptyBufferError
from ..schema import flatten
from .output import EXIT_OK, Result, progress
from .paths import buffer_dir
from .rewards import buffer_rewards, reward_key

MAX_IMAGE_KEYS, FRAMES_PER_KEY = 3, 4
# How an episode ended -> (label, colour); an episode cut without a flag, or still running.
ENDINGS = {
    "terminated": ("terminated", "tab:blue"),
    "truncated": ("truncated", "tab:orange"),
    "open": ("no flag (cut or running)", "tab:gray"),
}


def is_image(spec) -> bool:
    shape = tuple(spec.row_shape)
    if spec.dtype != np.uint8 or len(shape) not in (2, 3) or min(shape[:2]) < 4:
        return False
    return len(shape) == 2 or shape[2] in (1, 3)


def default_out(path) -> Path:
    """``<last path component>.png`` in the current directory."""
    name = str(path).rstrip("/").rsplit("/", 1)[-1] or "buffer"
    return Path(f"{Path(name).stem or name}.png")


def moving_average(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Trailing mean over ``window`` episodes (about a tenth of them, 2..100)."""
    window = int(min(100, max(2, len(values) // 10)))
    if len(values) < window:
        return np.zeros(0), window
    c = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
    return (c[window:] - c[:-window]) / window, window


def endings(table) -> np.ndarray:
    return np.where(
        table["terminated"], "terminated", np.where(table["truncated"], "truncated", "open")
    )


def run(args) -> Result:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    import zreplay

    view = zreplay.open(buffer_dir(args.path))
    table = view.episode_table()
    lengths = table["length"]
    n = len(lengths)
    if n == 0:
        raise EmptyBufferError(f"{view.path} holds no episodes; nothing to plot")
    how = endings(table)
    key = reward_key(view.keys())
    image_keys = [k for k in view.keys() if is_image(view.schema.specs[k])][:MAX_IMAGE_KEYS]
    per_step = returns = np.zeros(0)
    if key is not None:
        with progress(args, view.num_rows, "plot", "row") as bar:
            per_step, _, returns = buffer_rewards(view, key, bar.update)

    fig = plt.figure(figsize=(16, 3.4 * (1 + len(image_keys))), layout="constrained")
    grid = fig.add_gridspec(1 + len(image_keys), 3 * FRAMES_PER_KEY)
    ax_ret, ax_len, ax_lhist, ax_rhist = (
        fig.add_subplot(grid[0, 3 * i : 3 * i + 3]) for i in range(4)
    )
    x = np.arange(n)
    window = None
    for ax, values, title in (
        (ax_ret, returns, f"episode return (sum of {key!r})" if key else "episode return"),
        (ax_len, lengths, "episode length"),
    ):
        if not len(values):
            ax.text(0.5, 0.5, f"no {' or '.join(REWARD_KEYS)} key", ha="center", va="center")
        for end, (label, color) in ENDINGS.items():
            sel = how == end
            if len(values) and sel.any():
                ax.scatter(x[sel], values[sel], s=8, color=color, label=f"{label} ({sel.sum()})")
        if ax is ax_ret and len(values) and np.isfinite(values).all():
            avg, window = moving_average(values)
            if len(avg):
                ax.plot(x[window - 1 :], avg, color="black", lw=1.2, label=f"mean of {window}")
        if len(values):
            ax.legend(fontsize=7, loc="best")
        ax.set_title(title)
        ax.set_xlabel("episode (oldest first)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_lhist.hist(lengths, bins=min(50, max(1, len(np.unique(lengths)))), color="tab:green")
    ax_lhist.set_title("episode lengths")
    ax_lhist.set_xlabel("steps")
    finite = per_step[np.isfinite(per_step)]  # NaN and inf have no bin: counted aside
    if len(finite):
        ax_rhist.hist(finite, bins=50, color="tab:purple")
    title = f"per-step {key!r}" if key else "reward histogram (no reward key)"
    if len(finite) < len(per_step):
        title += f" ({len(per_step) - len(finite)} NaN/inf left out)"
    ax_rhist.set_title(title)

    positions = np.unique(np.linspace(0, view.num_rows - 1, FRAMES_PER_KEY).astype(np.int64))
    for r, image in enumerate(image_keys, start=1):
        frames = flatten(view.rows(positions, keys=[image]))[image]
        for j, (pos, frame) in enumerate(zip(positions, frames, strict=True)):
            ax = fig.add_subplot(grid[r, 3 * j : 3 * j + 3])
            gray = frame.ndim == 2 or frame.shape[-1] == 1
            ax.imshow(
                frame.reshape(frame.shape[:2]) if gray else frame,
                cmap="gray" if gray else None,
                vmin=0,
                vmax=255,
            )
            ax.set_title(f"{image} row {int(pos)}", fontsize=9)
            ax.axis("off")
    fig.suptitle(f"{view.path}: {n} episodes, {view.num_rows} rows")
    out = Path(args.out) if args.out else default_out(args.path)
    fig.savefig(out, dpi=args.dpi)
    plt.close(fig)

    result = {
        "path": str(view.path),
        "out": str(out),
        "episodes": n,
        "episodes_terminated": int((how == "terminated").sum()),
        "episodes_truncated": int((how == "truncated").sum()),
        "reward_key": key,
        "image_keys": image_keys,
        "mean_return": float(returns.mean()) if len(returns) else None,
        "moving_average_window": window,
        "mean_length": float(lengths.mean()),
    }
    text = f"wrote {out}: {n} episodes, mean length {result['mean_length']:.3g}"
    if result["mean_return"] is not None:
        text += f", mean return {result['mean_return']:.3g}"
    if image_keys:
        text += f", frames of {', '.join(image_keys)}"
    return EXIT_OK, result, text
