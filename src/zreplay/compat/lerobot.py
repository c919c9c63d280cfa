"""``import_lerobot``: a local LeRobot dataset directory (v3.0 or v2.1) into a new buffer.

Each LeRobot episode becomes one trajectory ``[L, 1]`` (one episode of the buffer's
episode table), in ``episode_index`` order.  Features keep their names and the dtypes and
shapes ``info.json`` declares, but ``next.reward`` is stored as ``rewards`` and
``next.done`` as ``terminated``, with a ``truncated`` column set on the last frame of an
episode that does not end done (so the episode table says how each one ended).  Frames of
``video`` features are decoded once, sequentially per mp4 (PyAV), and ``image`` features
(PNG in the parquet) per row; both are stored as uint8 ``[H, W, C]`` rows.

The buffer is built aside and appears at ``dst`` whole (as ``import_rlinf``); the reader
(:mod:`.lerobot_read`) holds one data file and one episode's frames at a time, and the
episodes read ahead of the writer are bounded (``BATCH_EPISODES``, ``BATCH_BYTES``).  Task strings and the dataset's
metadata go to the buffer's ``lerobot`` group (FORMAT.md, "Imported datasets").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core import OFFLINE_WRITER, BufferCore, Prepared, RamPolicy, RandomStream, seal
from ..errors import FormatError
from ..store.guard import new_tree
from ..store.layout import SHARD_TARGET_BYTES
from ..store.location import locate
from ..threads import deferred_interrupts
from .lerobot_format import (
    DONE,
    IMAGE,
    REWARD,
    REWARDS_KEY,
    TERMINATED_KEY,
    TRUNCATED_KEY,
    VIDEO,
    Feature,
    Info,
    read_info,
)
from .lerobot_read import TOLERANCE_S, Episode, Videos, iter_episodes, need, plan

# The group of the buffer that holds what the dataset said beyond its rows.
GROUP = "lerobot"
# Episodes read ahead of the writer, added together (at most this many, or bytes).
BATCH_EPISODES = 64
BATCH_BYTES = 32 << 20


@dataclass
class LeRobotImport:
    """What :func:`import_lerobot` imported: ``episodes``, ``frames`` (rows), ``tasks``
    (the strings by ``task_index``), ``features`` (LeRobot name -> ``"video"``,
    ``"image"`` or ``"array"``), ``keys`` (LeRobot name -> buffer key), the decoded
    ``video_frames`` and the ``seconds`` it took."""

    path: str
    source: str
    codebase_version: str
    episodes: int
    frames: int
    tasks: list[str]
    features: dict[str, str]
    keys: dict[str, str]
    video_frames: int
    seconds: float

    def __str__(self) -> str:
        videos = [k for k, v in self.features.items() if v == VIDEO]
        images = [k for k, v in self.features.items() if v == IMAGE]
        return (
            f"imported {self.episodes} episodes, {self.frames} frames, {len(self.tasks)} tasks "
            f"from {self.source} (LeRobot {self.codebase_version}) into {self.path}: "
            f"{len(videos)} video features ({self.video_frames} frames decoded), "
            f"{len(images)} image features, {len(self.features) - len(videos) - len(images)} "
            f"other features, in {self.seconds:.1f} s"
        )


def buffer_key(name: str) -> str:
    """The buffer key of LeRobot feature ``name``."""
    return {REWARD: REWARDS_KEY, DONE: TERMINATED_KEY}.get(name, name)


def check_keys(info: Info) -> None:
    """``FormatError`` when two features would be stored under one key (a feature named
    ``rewards`` beside ``next.reward``, or ``truncated`` beside ``next.done``)."""
    names = {k: buffer_key(k) for k in info.features}
    if DONE in info.features:
        names["(the truncated flags of next.done)"] = TRUNCATED_KEY
    seen: dict[str, str] = {}
    for name, key in names.items():
        if key in seen:
            raise FormatError(
                f"features {seen[key]!r} and {name!r} would both be stored as {key!r}; "
                "rename one in the dataset first"
            )
        seen[key] = name


def frame_layout(feat: Feature) -> dict:
    """How one camera's frames are stored (a ``layout=`` entry): one frame per chunk, a
    few MB per shard.  The one place an image codec would be chosen."""
    row = max(1, int(np.prod(feat.shape)))
    return {
        "chunk_rows": 1,
        "shard_rows": 1 << max(0, (SHARD_TARGET_BYTES // row).bit_length() - 1),
    }


def as_buffer_columns(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One episode's LeRobot columns under their buffer keys, ``truncated`` added."""
    out = {buffer_key(k): v for k, v in cols.items()}
    if TERMINATED_KEY in out:
        done = out[TERMINATED_KEY]
        truncated = np.zeros_like(done, dtype=bool)
        # An episode that does not end done was cut short (LeRobot records stop there).
        truncated[-1] = ~done[-1].astype(bool)
        out[TRUNCATED_KEY] = truncated
    return out


# -- the import -----------------------------------------------------------------------


def import_lerobot(
    src: str | Path,
    dst,
    *,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
    tolerance_s: float = TOLERANCE_S,
    **options,
) -> LeRobotImport:
    """Read the local LeRobot dataset directory ``src`` (codebase version v3.0 or v2.1)
    into a new buffer at ``dst``; returns a :class:`LeRobotImport` report.

    Each episode becomes one trajectory ``[L, 1]``, in ``episode_index`` order.  Feature
    names are kept as keys, with the dtypes and shapes of ``info.json``; ``next.reward``
    is stored as ``rewards``, ``next.done`` as ``terminated`` (bool, as declared), and a
    ``truncated`` column marks the last frame of an episode that does not end done.
    ``video`` and ``image`` features are stored as uint8 ``[H, W, C]`` frames (videos
    decoded once with PyAV, each episode exactly its ``length`` frames, each within
    ``tolerance_s`` of its row's timestamp, as LeRobot's reader requires).  Task strings
    and the dataset's ``info.json`` are kept in the buffer's ``lerobot`` group.

    ``progress(k)`` after each episode of ``k`` frames.  ``options`` go to the buffer's
    writer (``layout``, ``durable``, ``storage_options``, ``staging_bytes``).  All or
    nothing: built aside, so a failure (``FormatError`` naming the file for damaged
    input, ``DestinationError`` for a ``dst`` that exists without ``overwrite=True``)
    leaves ``dst`` as it was.  Needs ``pip install 'zreplay[lerobot]'`` (pyarrow, PyAV).
    """
    started = time.perf_counter()
    if (
        isinstance(tolerance_s, bool)
        or not isinstance(tolerance_s, (int, float))
        or not tolerance_s >= 0
    ):
        raise ValueError(f"tolerance_s must be a number of seconds >= 0, got {tolerance_s!r}")
    root = Path(src)
    if not root.is_dir():
        raise FormatError(
            f"{root} is not a directory; import_lerobot reads a local LeRobot dataset"
        )
    for name in ("pyarrow.parquet", "av"):  # a missing extra, said before anything else
        need(name)
    info = read_info(root)
    check_keys(info)
    episodes, tasks = plan(root, info)  # every refusal of the metadata before dst is touched
    layout = {k: frame_layout(f) for k, f in info.features.items() if f.is_frame}
    layout.update(options.pop("layout", None) or {})
    target = locate(dst, options.get("storage_options"))
    videos = Videos(float(tolerance_s))
    options.setdefault("writer_id", OFFLINE_WRITER)  # sealed: the buffer's offline part
    with new_tree(target, "import_lerobot", overwrite=overwrite, sources=[locate(root)]) as tmp:
        core = None
        try:
            with deferred_interrupts():  # the writer is made and then closed, or never made
                core = BufferCore.writer(
                    tmp,
                    stream=RandomStream(tag="swm"),
                    ram=RamPolicy(enabled=False),
                    layout=layout,
                    **options,
                )
            batch, nbytes = [], 0
            for cols in map(as_buffer_columns, iter_episodes(root, info, episodes, videos)):
                if not core.facade_state.get("columns"):  # its ReplayBuffer reopens the order
                    core.facade_state["columns"] = list(cols)
                n = len(next(iter(cols.values())))
                batch.append(
                    Prepared({k: v[:, None] for k, v in cols.items()}, n, 1, split_episodes=False)
                )
                nbytes += sum(v.nbytes for v in cols.values())
                # Episodes are added in batches: one add per episode cost ~15 ms each.
                if nbytes >= BATCH_BYTES or len(batch) >= BATCH_EPISODES:
                    core.add(batch)
                    batch, nbytes = [], 0
                if progress is not None:
                    progress(n)
            core.add(batch)
            core.flush()
        finally:
            videos.close()
            if core is not None:
                core.close()
        seal(tmp, options["writer_id"], options.get("storage_options"))
        _write_group(tmp, info, episodes, tasks, root)
    return LeRobotImport(
        path=str(target),
        source=str(root),
        codebase_version=info.version,
        episodes=len(episodes),
        frames=sum(ep.length for ep in episodes),
        tasks=tasks,
        features={k: f.kind for k, f in info.features.items()},
        keys={k: buffer_key(k) for k in info.features},
        video_frames=videos.decoded,
        seconds=time.perf_counter() - started,
    )


def _write_group(tmp, info: Info, episodes: list[Episode], tasks: list[str], root: Path) -> None:
    """The buffer's ``lerobot`` group: what the dataset says beyond its rows, in its
    attributes (plain JSON any zarr reads)."""
    import zarr

    number = {t: i for i, t in enumerate(tasks)}
    group = zarr.open_group(store=tmp.backend.zarr_store(tmp), mode="r+")
    sub = group.create_group(GROUP)
    sub.attrs[GROUP] = {
        "codebase_version": info.version,
        "fps": info.raw.get("fps"),
        "robot_type": info.robot_type,
        "source": str(root),
        "features": info.raw.get("features"),
        "keys": {k: buffer_key(k) for k in info.features},
        "tasks": tasks,
        "episode_index": [ep.index for ep in episodes],
        "episode_tasks": [[number.get(t, -1) for t in ep.tasks] for ep in episodes],
    }
