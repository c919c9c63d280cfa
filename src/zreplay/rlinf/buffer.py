"""``TrajectoryReplayBuffer``: a drop-in for RLinf 0.3's class, on a Zarr store.

Same constructor names and meanings, same methods, same sample keys, nesting and dtypes.
What differs (all on purpose, see README "Coming from RLinf"):

* rows are read individually from compressed chunked arrays, never whole trajectory files;
* ``add_trajectories`` validates and copies on the caller's thread and commits atomically
  on a background writer; ``flush()`` waits for the commit;
* ``sample`` returns exactly ``num_chunks`` rows and is safe against concurrent adds;
* ``close()``/``clear_cache()`` never break the buffer; ``clear()`` removes data on disk;
* constructing on an existing ``auto_save_path`` resumes it, continuing its random stream;
* ``np.random`` is never seeded globally.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import sampling
from ..clips import ClipSpec
from ..engine.core import Engine, RamPolicy
from ..errors import EmptyBufferError, FormatError
from ..nstep import NStepSpec
from ..prefetch import Prefetcher
from ..samplers import Sampler, Window, as_sampler
from ..samplers.engine import EngineSampler, SamplerAccess
from ..schema import unflatten
from ..store.location import location, options_of
from ..store.root import BufferRoot, is_buffer
from .trajectory import prepare

log = logging.getLogger("zreplay")

DEFAULT_IN_MEMORY_RAM_BYTES = 2 << 30


class TrajectoryReplayBuffer(sampling.EngineEpisodes, SamplerAccess):
    """Trajectory replay buffer with RLinf 0.3's API on a persistent Zarr v3 store.

    Args (RLinf's, same meaning):
        seed: seeds the sampler's private generator (numpy PCG64; never global state);
            ``None`` draws a fresh seed.
        enable_cache: keep recent rows decoded in RAM (the RAM tier). ``False``: every
            sample of committed data reads from disk.
        cache_size: number of newest trajectories the RAM tier holds.
        sample_window_size: sample from the last N trajectories; 0 = all (the default
            sampler, ``zreplay.samplers.Window(sample_window_size)``; ``sampler=`` replaces it).
        auto_save: ``True`` = persistent buffer at ``auto_save_path``; ``False`` = a private
            temporary store deleted on ``close()`` (as in RLinf, the RAM tier then holds
            ``sample_window_size`` trajectories; older ones stay sampleable from the store).
        auto_save_path: buffer directory (a Zarr v3 group). An existing buffer is resumed.
        trajectory_format: default format of :meth:`export` (``"pt"``; anything else: pkl).

    Args (zreplay's):
        capacity: maximum rows kept; the oldest whole trajectories are evicted (FIFO).
        ram_budget_bytes: cap on the RAM tier's size in bytes.
        layout: per-key chunk/shard/codec overrides, e.g.
            ``{"curr_obs/main_images": {"codec": "zstd", "level": 3}}``.
        overwrite: start fresh even if ``auto_save_path`` holds a buffer.
        writer_id: name of this writer's segment (one writer per segment).
        durable: fsync before publishing each commit (power-loss safety).
        break_lock: take over a writer lock left by a dead writer on another host.
        continue_episodes: default of ``add_trajectories(continues=)``: each trajectory's
            environment lanes continue the episodes the same lanes of the previous
            trajectory left running (consecutive rollout chunks of the same envs).
        storage_options: for an ``s3://bucket/prefix`` ``auto_save_path``: fsspec/s3fs
            options such as ``{"endpoint_url": ..., "key": ..., "secret": ...}``.
        sampler: a :mod:`zreplay.samplers` sampler (``Uniform``, ``Window``, ``Recency``,
            ``Prioritized``, ``PrioritizedClips``) or a callable ``fn(step, buffer,
            batch_size, history_len)`` returning row positions ``[0, total_samples)``.
            Used by ``sample``, ``sample_clips`` and ``sample_nstep``; its state (and
            priorities) is saved with the buffer and restored when it is reopened with a
            sampler of the same kind.
    """

    def __init__(
        self,
        seed: int | None = 1234,
        enable_cache: bool = True,
        cache_size: int = 5,
        sample_window_size: int = 100,
        auto_save: bool = False,
        auto_save_path: str = "",
        trajectory_format: str = "pt",
        *,
        capacity: int | None = None,
        ram_budget_bytes: int | None = None,
        layout: Mapping[str, Mapping] | None = None,
        overwrite: bool = False,
        writer_id: str = "default",
        durable: bool = True,
        break_lock: bool = False,
        continue_episodes: bool = False,
        storage_options: Mapping | None = None,
        sampler: Sampler | Any | None = None,
    ):
        if auto_save and not auto_save_path:
            raise ValueError("auto_save=True needs auto_save_path (the buffer directory)")
        if sample_window_size < 0:
            raise ValueError(f"sample_window_size must be >= 0, got {sample_window_size}")
        # seed=None: a fresh random seed (kept in the commit, so a resume continues it).
        self.seed = int(np.random.SeedSequence().entropy % (1 << 63)) if seed is None else int(seed)
        self.enable_cache = enable_cache
        self._window = int(sample_window_size)
        self.auto_save = auto_save
        self.auto_save_path = auto_save_path
        self.trajectory_format = trajectory_format
        if not auto_save and enable_cache:
            # RLinf: a RAM-only buffer caches its whole sampling window.
            cache_size = sample_window_size or None
            if cache_size is None and ram_budget_bytes is None:
                ram_budget_bytes = DEFAULT_IN_MEMORY_RAM_BYTES
        self.cache_size = cache_size
        self.continue_episodes = continue_episodes
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        self._num_sampled = 0
        self._step = 0  # sample calls: a hook's step, a prioritized sampler's beta clock
        self._sampling = EngineSampler(as_sampler(sampler, Window(self._window)))
        self._engine = Engine(
            auto_save_path if auto_save else None,
            writer_id=writer_id,
            capacity=capacity,
            ram=RamPolicy(
                enabled=enable_cache, trajectories=cache_size, max_bytes=ram_budget_bytes
            ),
            layout=layout,
            durable=durable,
            overwrite=overwrite,
            break_lock=break_lock,
            storage_options=storage_options,
            sampler_state=self._sampler_state,
            sampler_persist=self._sampling.persist,
        )
        self._sampling.bind(self._engine)
        self._restore_sampler(self._engine.commit.sampler)

    # -- sampler state --------------------------------------------------------------

    @property
    def sample_window_size(self) -> int:
        """RLinf's window (last N trajectories; 0 = all); setting it resizes a ``Window``
        sampler (the default one)."""
        return self._window

    @sample_window_size.setter
    def sample_window_size(self, n: int) -> None:
        if isinstance(self.sampler, Window):
            self.sampler.size = Window(n).size  # validates
        self._window = int(n)

    @property
    def sampler(self) -> Sampler:
        """The sampler (``zreplay.samplers``) that ``sample`` and friends draw with."""
        return self._sampling.sampler

    def _stream_state(self) -> dict:
        """The random stream and counters (what a rank's load replaces)."""
        return {
            "seed": self.seed,
            "rng": self._rng.bit_generator.state,
            "num_sampled": self._num_sampled,
            "step": self._step,
        }

    def _sampler_state(self) -> dict:
        return {**self._stream_state(), **self._sampling.state()}

    def _restore_sampler(self, state: Mapping | None) -> None:
        if not state or "rng" not in state:
            return
        self._rng.bit_generator.state = dict(state["rng"])
        self._num_sampled = int(state.get("num_sampled", 0))
        self._step = int(state.get("step", 0))
        self.seed = int(state.get("seed", self.seed))
        self._sampling.load_state(state)

    # -- RLinf API ------------------------------------------------------------------

    def add_trajectories(self, trajectories: Iterable[Any], *, continues=None) -> list[int]:
        """Append trajectories; returns their ids.

        Each item: a :class:`zreplay.Trajectory`, an RLinf ``Trajectory`` or a dict of
        ``[T, B, ...]`` arrays/tensors (nested dicts allowed).  All items are validated
        before any is written; on error nothing is added.  Compression and the commit
        happen on a background thread: call :meth:`flush` to wait for them.  The caller
        may reuse its tensors as soon as this returns.

        Episodes are cut after every step whose ``terminations``/``truncations`` (or
        ``dones``) flag is set.  ``continues`` (bool or ``[B]`` bools; default
        ``continue_episodes``): lane ``b``'s first step continues the episode lane ``b``
        of the previous trajectory left running, so episodes may span trajectories.
        """
        cont = self.continue_episodes if continues is None else continues
        items = [prepare(t) for t in trajectories]
        for it in items:
            it.continues = cont
        return self._engine.add(items)

    def sample(
        self,
        num_chunks: int = 0,
        *,
        device: str | torch.device | None = None,
        pin_memory: bool = False,
    ) -> dict[str, Any]:
        """``num_chunks`` transitions drawn with replacement by the sampler (by default
        uniformly from the last ``sample_window_size`` trajectories, as RLinf does).

        Returns RLinf's nested dict of tensors ``[num_chunks, ...]`` (e.g.
        ``actions [n, C*A]``, ``rewards [n, C]``, ``curr_obs/main_images [n, H, W, 3] uint8``).
        A prioritized sampler adds ``index`` (int64 ``[n]``, for :meth:`update_priorities`)
        and ``weight`` (float32 ``[n]`` importance weights, max possible 1); with
        ``PrioritizedClips`` the batch holds ``num_chunks`` clips ``[n, history_len, ...]``.
        Rows are gathered straight into the returned tensors' memory; with
        ``pin_memory=True`` that memory is page-locked, so a following ``device="cuda"``
        copy is asynchronous (``non_blocking``).  Without an accelerator, ``pin_memory`` is
        ignored with a warning, as in ``torch.utils.data.DataLoader``.
        """
        if num_chunks <= 0:
            raise ValueError(f"num_chunks must be > 0, got {num_chunks}")
        return self.sample_chunks(num_chunks, device=device, pin_memory=pin_memory)

    def sample_chunks(
        self,
        num_chunks: int,
        *,
        device: str | torch.device | None = None,
        pin_memory: bool = False,
    ) -> dict[str, Any]:
        clips = self.sampler.clips
        if clips is not None:
            got = sampling.gather_clips(self._gather, clips, self._keys(), self._pick(num_chunks))
            return unflatten({k: torch.from_numpy(v).to(device or "cpu") for k, v in got.items()})
        pin = pin_memory and _can_pin()
        tensors: dict[str, torch.Tensor] = {}
        extra = {}

        def draw(index):
            if index.visible_rows <= 0:
                raise EmptyBufferError("Cannot sample from an empty buffer.")
            rows, got = self._sampling.draw_rows(self._rng, num_chunks, self._step, self)
            extra.update(got)
            self._num_sampled += num_chunks
            self._step += 1
            return rows

        def alloc(key, shape, dtype):
            t = torch.empty(shape, dtype=_torch_dtype(dtype), pin_memory=pin)
            tensors[key] = t
            return t.numpy()

        self._engine.draw_and_gather(draw, alloc=alloc)
        sampling.add_extra(tensors, {k: torch.from_numpy(v) for k, v in extra.items()})
        if device is not None:
            tensors = {k: t.to(device, non_blocking=pin) for k, t in tensors.items()}
        return unflatten(tensors)

    def prefetch(
        self,
        num_chunks: int,
        depth: int = 2,
        *,
        device: str | torch.device | None = None,
        pin_memory: bool = False,
    ) -> Prefetcher:
        """An endless iterator of ``sample(num_chunks)`` batches drawn ``depth`` ahead on a
        background thread, so disk reads overlap the training step.  Use as a context
        manager (or call ``close()``).  Batches come from the same random stream, in order."""
        return Prefetcher(
            lambda: self.sample(num_chunks, device=device, pin_memory=pin_memory), depth
        )

    def __len__(self) -> int:
        return self._engine.index.num_visible

    @property
    def size(self) -> int:
        return len(self)

    @property
    def total_samples(self) -> int:
        """Transitions (rows) in the buffer: the sum of T*B over its trajectories."""
        return self._engine.index.visible_rows

    def is_ready(self, min_size: int) -> bool:
        """RLinf: ``len(buffer) >= min_size``, counted in trajectories."""
        return len(self) >= min_size

    async def is_ready_async(self, min_size: int) -> bool:
        return self.is_ready(min_size)

    def get_stats(self) -> dict[str, Any]:
        """RLinf's stats (``num_trajectories``, ``total_samples``, ``cache_size``) and more."""
        st = self._engine.stats()
        return {
            "num_trajectories": st["trajectories"],
            "total_samples": st["rows"],
            "cache_size": st["trajectories_in_ram"],
            "rows_in_ram": st["rows_in_ram"],
            "ram_bytes": st["ram_bytes"],
            "committed_trajectories": st["committed_trajectories"],
            "pending_trajectories": st["pending_trajectories"],
            "path": st["path"],
        }

    def flush(self) -> None:
        """Block until every added trajectory is committed to the store."""
        self._engine.flush()

    def close(self, wait: bool = True) -> None:
        """Flush, save the sampler state and release the writer lock. Idempotent."""
        self._engine.close()

    def clear(self) -> None:
        """Remove all trajectories, including their data on disk (ids are not reused)."""
        self._engine.clear()

    def clear_cache(self) -> None:
        """Drop the RAM tier's committed rows; the data stay sampleable from disk."""
        self._engine.drop_ram()

    def __enter__(self) -> TrajectoryReplayBuffer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        eng = getattr(self, "_engine", None)
        if eng is not None and not eng.closed:
            try:
                eng.close()
            except Exception:
                pass

    @property
    def path(self) -> Path:
        return self._engine.path

    @property
    def schema(self):
        return self._engine.schema

    # -- checkpoints ----------------------------------------------------------------

    def save_checkpoint(self, save_path: str) -> None:
        """Write a complete, consistent checkpoint of the buffer to ``save_path``.

        Pending writes are committed first; the sampler's RNG state is included.  Data
        files are hard-linked (no copying) where the filesystem allows.  The result is a
        zreplay buffer directory: ``zreplay.open(save_path)`` reads it.
        """
        self._engine.checkpoint(save_path)

    def load_checkpoint(
        self,
        load_path: str,
        is_distributed: bool = False,
        local_rank: int = 0,
        world_size: int = 1,
        *,
        allow_pickle: bool = False,
        storage_options: Mapping | None = None,
    ) -> None:
        """Replace this buffer's contents with a checkpoint's (RLinf semantics).

        ``load_path``: a directory from :meth:`save_checkpoint`, any zreplay buffer, or an
        RLinf checkpoint directory (``metadata.json`` + ``trajectory_index.json``).  With
        ``is_distributed``, rank ``local_rank`` of ``world_size`` takes its contiguous block
        of trajectories (the first ``N % world_size`` ranks get one more), so ranks are
        disjoint and cover all.  Trajectory ids are kept.  A full load resumes the saved
        random stream; a rank's load seeds a rank-specific stream.  ``load_path`` may be
        an ``s3://`` URL (``storage_options`` default to this buffer's own).
        """
        from .files import load_into

        if is_distributed and not 0 <= local_rank < world_size:
            raise ValueError(f"local_rank {local_rank} is outside [0, {world_size})")
        if not is_distributed:
            local_rank, world_size = 0, 1
        src = location(load_path, storage_options or options_of(self.path))
        if not self._engine.temporary and str(src.resolve()) == str(self.path.resolve()):
            if is_distributed and world_size > 1:
                raise ValueError(
                    f"{load_path} is this buffer's own directory; a rank's share must be "
                    "loaded into another buffer (give each rank its own auto_save_path)"
                )
            return  # already resumed from it by the constructor
        load_into(self, src, local_rank, world_size, is_distributed, allow_pickle=allow_pickle)

    def _set_rank_stream(self, seed: int, rank: int | None) -> None:
        """Restart the random stream: a fresh buffer's for ``rank=None``, else one per rank."""
        self.seed = seed
        bits = np.random.SeedSequence(seed, spawn_key=(rank,)) if rank is not None else seed
        self._rng = np.random.Generator(np.random.PCG64(bits))
        self._num_sampled = 0
        self._step = 0

    # -- RLinf files ----------------------------------------------------------------

    # -- episodes, clips and n-step (zreplay) -------------------------------------------

    def sample_clips(
        self,
        num_clips: int,
        history_len: int,
        frameskip: int = 1,
        pad: str | None = None,
        action_keys: tuple[str, ...] = ("actions",),
    ) -> dict[str, Any]:
        """Clips ``[num_clips, history_len, ...]`` (tensors) drawn by the sampler over
        every valid window of every episode (uniformly by default); never across an
        episode boundary."""
        spec = ClipSpec(history_len, frameskip, pad, action_keys)
        got = sampling.gather_clips(self._gather, spec, self._keys(), self._pick(num_clips))
        return unflatten({k: torch.from_numpy(v) for k, v in got.items()})

    def _pick(self, n: int):
        if int(n) <= 0:
            raise ValueError(f"the number of samples must be > 0, got {n}")
        step, self._step = self._step, self._step + 1
        return self._sampling.pick(self._rng, int(n), step, self)

    def sample_nstep(self, num_chunks: int, n: int = 1, gamma: float = 0.99, **kw) -> dict:
        """Transitions with n-step returns (tensors); ``next_obs`` n steps ahead from the
        stored ``next_obs`` (see :class:`zreplay.nstep.NStepSpec` for ``kw``)."""
        kw.setdefault(
            "obs_key", "curr_obs" if "curr_obs" in {k.split("/")[0] for k in self._keys()} else None
        )
        spec = NStepSpec(n, gamma, **kw)
        got = sampling.gather_nstep(self._gather, spec, self._keys(), self._pick(num_chunks))
        return unflatten({k: torch.from_numpy(v) for k, v in got.items()})

    def dump(self, path: str | Path, format: str = "hdf5", mode: str = "overwrite") -> None:
        """Write every episode as ``"hdf5"`` or a ``"zarr"`` episode buffer."""
        from ..formats import dump

        dump(self, path, format=format, mode=mode)

    def export(self, path: str, format: str | None = None) -> int:
        """Write RLinf 0.3's on-disk layout (``trajectory_{id}_{weights}.pt|.pkl``,
        ``metadata.json``, ``trajectory_index.json``); returns trajectories written."""
        from .files import export_rlinf

        fmt = format or ("pt" if self.trajectory_format == "pt" else "pkl")
        return export_rlinf(self, Path(path), fmt)

    def trajectory(self, i: int) -> dict[str, Any]:
        """Visible trajectory ``i`` (0 = oldest kept) as nested ``[T, B, ...]`` numpy arrays,
        plus ``trajectory_id``, ``max_episode_length`` and ``model_weights_id``."""
        eng = self._engine
        idx = eng.index
        n = idx.num_visible
        if not -n <= i < n:
            raise IndexError(f"trajectory {i} out of range for {n} trajectories")
        j = idx.low + (i % n)
        out = unflatten(eng.read_trajectory(j))
        out["trajectory_id"] = int(idx.column("trajectory_id")[j])
        out["max_episode_length"] = int(idx.column("max_episode_length")[j])
        out["model_weights_id"] = idx.weights_id(j)
        return out


_TORCH_DTYPES: dict[np.dtype, torch.dtype] = {}


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    t = _TORCH_DTYPES.get(dtype)
    if t is None:
        t = _TORCH_DTYPES[dtype] = torch.from_numpy(np.empty(0, dtype)).dtype
    return t


_pin_warned = False


def _can_pin() -> bool:
    global _pin_warned
    if torch.cuda.is_available():
        return True
    if not _pin_warned:
        warnings.warn(
            "pin_memory=True but no CUDA device is available; returning unpinned tensors",
            stacklevel=3,
        )
        _pin_warned = True
    return False


def _is_rlinf_dir(path: Path) -> bool:
    return (path / "metadata.json").is_file() and (path / "trajectory_index.json").is_file()


def checkpoint_kind(path: Path) -> str:
    if is_buffer(path):
        return "zreplay"
    if _is_rlinf_dir(path):
        return "rlinf"
    raise FormatError(
        f"{path} is neither a zreplay buffer nor an RLinf checkpoint directory "
        "(metadata.json + trajectory_index.json)"
    )


__all__ = ["TrajectoryReplayBuffer", "checkpoint_kind", "BufferRoot"]
