"""``TrajectoryReplayBuffer``: a drop-in for RLinf 0.3's class, on a Zarr store.

Same constructor names and meanings, same methods, same sample keys, nesting and dtypes.
What differs (all on purpose, see docs/rlinf.md): rows are read individually
from compressed chunked arrays; ``add_trajectories`` validates and copies on the caller's
thread and commits atomically on a background writer (``flush()`` waits for the commit);
``sample`` returns exactly ``num_chunks`` rows, safe against concurrent adds;
``close()``/``clear_cache()`` never break the buffer, ``clear()`` removes data on disk;
an existing ``auto_save_path`` is resumed; ``np.random`` is never seeded globally.

RLinf's names and tensors over a :class:`~zreplay.core.WritableCore` (``self.core``); the
lifecycle and the reads every facade shares are :class:`~zreplay.api.facade.WritableFacade`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Unpack

import torch

from ..compat.dumps import dump
from ..compat.rlinf_files import check_trajectory_format, export_rlinf, load_into
from ..compat.rlinf_trajectory import prepare_all
from ..core import BufferCore, RamPolicy, RandomStream
from ..core.options import StoreOptions, store_options
from ..errors import DeviceUnavailableError
from ..numbers import as_int, as_optional_float
from ..samplers import Sampler, Window
from ..sampling.clips import ClipSpec
from ..sampling.nstep import NStepSpec
from ..store.location import locate
from .batches import as_tensors, device_problem, nested_tensors, tensor_alloc, trajectory_dict
from .facade import Of, WritableFacade
from .prefetch import Prefetcher
from .view import BufferView

DEFAULT_IN_MEMORY_RAM_BYTES = 2 << 30


class TrajectoryReplayBuffer(WritableFacade):
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
        trajectory_format: default format of :meth:`export`: ``"pt"`` or ``"pkl"``.

    Args (zreplay's):
        capacity: maximum rows kept; the oldest whole trajectories are evicted (FIFO).
        continue_episodes: default of ``add_trajectories(continues=)`` (lanes continue
            the episodes the same lanes of the previous trajectory left running).
        sampler: a :mod:`zreplay.samplers` sampler (``Uniform``, ``Window``, ``Recency``,
            ``Prioritized``, ``PrioritizedClips``, ``Staleness``) or a hook ``fn(step,
            buffer, batch_size, history_len)`` returning rows ``[0, total_samples)``; its
            state (priorities too) is saved with the buffer and restored on reopening.
        **store: the store options every writable buffer takes (:class:`zreplay.StoreOptions`:
            ``writer_id``, ``durable``, ``overwrite``, ``break_lock``, ``layout``,
            ``storage_options``, ``ram_budget_bytes``, ``staging_bytes``,
            ``rate_limiter``, ``learner_id``).

    Pickled (e.g. passed to a Ray task) it becomes a read-only :func:`zreplay.open` view
    of the same location: a segment has one writer, which stays here.
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
        continue_episodes: bool = False,
        sampler: Sampler | Any | None = None,
        **store: Unpack[StoreOptions],
    ):
        opts = store_options("TrajectoryReplayBuffer", store, ram_budget_bytes=None)
        ram_budget_bytes = opts.pop("ram_budget_bytes")
        if auto_save and not auto_save_path:
            raise ValueError("auto_save=True needs auto_save_path (the buffer directory)")
        check_trajectory_format(trajectory_format)
        sample_window_size = as_int(sample_window_size, "sample_window_size", minimum=0)
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
        ram = RamPolicy(enabled=enable_cache, trajectories=cache_size, max_bytes=ram_budget_bytes)
        self.core = BufferCore.writer(
            auto_save_path if auto_save else None,
            sampler=Window(self._window) if sampler is None else sampler,
            stream=RandomStream(seed),
            owner=self,
            capacity=capacity,
            ram=ram,
            **opts,
        )

    def __reduce__(self):
        # The writer stays in this process: the other side gets a view of what it committed.
        h = self.core.handoff(
            "TrajectoryReplayBuffer", "a zreplay.open view", "auto_save=True, auto_save_path"
        )
        return (BufferView, (h.path, None, h.sampler, h.storage_options))

    seed = Of(
        "core.stream",
        doc="The random stream's seed (saved with the buffer; a resume continues it).",
    )

    @property
    def sample_window_size(self) -> int:
        """RLinf's window (last N trajectories; 0 = all); setting it resizes a Window."""
        return self._window

    @sample_window_size.setter
    def sample_window_size(self, n: int) -> None:
        if isinstance(self.sampler, Window):
            self.sampler.size = Window(n).size  # validates
        self._window = int(n)

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
        return self.core.add(prepare_all(trajectories, cont))

    def sample(
        self,
        num_chunks: int = 0,
        *,
        device: str | torch.device | None = None,
        pin_memory: bool = False,
        version: float | None = None,
    ) -> dict[str, Any]:
        """``num_chunks`` transitions drawn with replacement by the sampler (by default
        uniformly from the last ``sample_window_size`` trajectories, as RLinf does);
        ``version``: the policy version being trained (for ``Staleness``).

        Returns RLinf's nested dict of tensors ``[num_chunks, ...]`` (e.g.
        ``actions [n, C*A]``, ``rewards [n, C]``, ``curr_obs/main_images [n, H, W, 3] uint8``).
        A prioritized sampler adds ``index`` (int64 ``[n]``, for :meth:`update_priorities`)
        and ``weight`` (float32 ``[n]`` importance weights, max possible 1); with
        ``PrioritizedClips`` the batch holds ``num_chunks`` clips ``[n, history_len, ...]``.
        Rows are gathered straight into the returned tensors' memory; with
        ``pin_memory=True`` that memory is page-locked, so a following ``device="cuda"``
        copy is asynchronous (``non_blocking``); without CUDA it is ignored with a warning.
        """
        num_chunks = as_int(num_chunks, "num_chunks", minimum=1)
        if problem := device_problem(device):
            raise DeviceUnavailableError(problem)
        version = as_optional_float(version, "version")
        alloc, tensors = tensor_alloc(pin_memory)
        got = self.core.sample(num_chunks, alloc=alloc, version=version)
        return as_tensors(got, tensors, device)

    def sample_chunks(self, num_chunks: int, **kw) -> dict[str, Any]:
        """RLinf's name for :meth:`sample` (same keywords)."""
        if problem := device_problem(kw.get("device")):
            raise DeviceUnavailableError(problem)
        return self.sample(num_chunks, **kw)

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
        if problem := device_problem(device):
            raise DeviceUnavailableError(problem)
        return Prefetcher(
            lambda: self.sample(num_chunks, device=device, pin_memory=pin_memory), depth
        )

    def __len__(self) -> int:
        return self.core.num_trajectories

    @property
    def size(self) -> int:
        return len(self)

    total_samples = Of(
        "core.engine",
        "num_rows",
        doc="Transitions (rows) in the buffer: the sum of T*B over its trajectories.",
    )

    def is_ready(self, min_size: int) -> bool:
        """RLinf: ``len(buffer) >= min_size``, counted in trajectories."""
        return len(self) >= min_size

    async def is_ready_async(self, min_size: int) -> bool:
        return self.is_ready(min_size)

    def get_stats(self) -> dict[str, Any]:
        """RLinf's stats (``num_trajectories``, ``total_samples``, ``cache_size``) and more."""
        st = self.core.engine.stats()
        rlinf = {"num_trajectories": "trajectories", "total_samples": "rows"}
        rlinf["cache_size"] = "trajectories_in_ram"
        more = ("rows_in_ram", "ram_bytes", "committed_trajectories", "pending_trajectories")
        return {**{k: st[v] for k, v in rlinf.items()}, **{k: st[k] for k in (*more, "path")}}

    def close(self, wait: bool = True) -> None:
        """Flush, save the sampler state and release the writer lock. Idempotent
        (``wait``: RLinf's; a close always waits for the commit)."""
        super().close()

    clear_cache = Of(
        "core.engine",
        "drop_ram",
        doc="Drop the RAM tier's committed rows; the data stay sampleable from disk.",
    )

    # ``with`` closes, as a file does (Facade's; ``ReplayBuffer``'s ``with`` only commits:
    # see docs/rlinf.md).

    def __repr__(self) -> str:
        where = "temporary store" if self.core.engine.temporary else str(self.path)
        if self.closed:
            return f"TrajectoryReplayBuffer(closed, {where})"
        what = f"{len(self)} trajectories, {self.total_samples} rows, sampler={self.sampler!r}"
        return f"TrajectoryReplayBuffer({where}: {what}, keys=[{', '.join(self.core.keys)}])"

    path = Of("core.engine", doc="The buffer's location (a Path, or an object-store location).")

    def save_checkpoint(self, save_path: str) -> None:
        """Write a complete, consistent checkpoint of the buffer to ``save_path``.

        Pending writes are committed first; the sampler's RNG state is included.  Data
        files are hard-linked (no copying) where the filesystem allows.  The result is a
        zreplay buffer directory: ``zreplay.open(save_path)`` reads it.  An older
        checkpoint at ``save_path`` is replaced in one step (a crash leaves the old one or
        the new); this buffer itself, a path inside or around it, a buffer with a live
        writer and any other non-empty directory are refused
        (:class:`~zreplay.DestinationError`, :class:`~zreplay.WriterLockedError`).
        """
        self.core.engine.checkpoint(save_path)

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
        an ``s3://`` URL (``storage_options`` default to this buffer's own).  RLinf files'
        trajectories continue each other's episodes when this buffer was made with
        ``continue_episodes=True`` (the files do not say).
        """
        local_rank = as_int(local_rank, "local_rank")
        world_size = as_int(world_size, "world_size", minimum=1)
        src = locate(load_path, storage_options or self.path.backend.storage_options)
        cont = self.continue_episodes
        load_into(
            self.core, src, local_rank, world_size, is_distributed, allow_pickle, continues=cont
        )

    def sample_clips(
        self, num_clips: int, history_len: int, frameskip: int = 1, pad: str | None = None,
        action_keys: tuple[str, ...] = ("actions",), version: float | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Clips ``[num_clips, history_len, ...]`` (tensors) drawn by the sampler over
        every valid window of every episode (uniformly by default); never across an
        episode boundary."""
        num_clips = as_int(num_clips, "num_clips", minimum=1)
        version = as_optional_float(version, "version")
        spec = ClipSpec(history_len, frameskip, pad, action_keys)
        return nested_tensors(self.core.sample_clips(spec, num_clips, version=version))

    def sample_nstep(self, num_chunks: int, n: int = 1, gamma: float = 0.99, **kw) -> dict:
        """Transitions with n-step returns (tensors); ``next_obs`` n steps ahead from the
        stored ``next_obs`` (see :class:`zreplay.sampling.nstep.NStepSpec` for ``kw``)."""
        has_obs = "curr_obs" in {k.split("/")[0] for k in self.core.keys}
        kw.setdefault("obs_key", "curr_obs" if has_obs else None)
        num_chunks = as_int(num_chunks, "num_chunks", minimum=1)
        version = as_optional_float(kw.pop("version", None), "version")
        spec = NStepSpec(n, gamma, **kw)
        return nested_tensors(self.core.sample_nstep(spec, num_chunks, version=version))

    def dump(self, path: str | Path, format: str = "hdf5", mode: str = "overwrite") -> None:
        """Write every episode as ``"hdf5"`` or a ``"zarr"`` episode buffer."""
        dump(self, path, format=format, mode=mode)

    def export(self, path: str, format: str | None = None) -> int:
        """Write RLinf 0.3's on-disk layout (``trajectory_{id}_{weights}.pt|.pkl``,
        ``metadata.json``, ``trajectory_index.json``) to the local directory ``path``;
        returns trajectories written.  Built aside and swapped in whole: an earlier export
        there is replaced; any other non-empty directory, or one inside or around this
        buffer, is refused (:class:`~zreplay.DestinationError`) before anything is written."""
        return export_rlinf(self.core, path, format or self.trajectory_format, self.seed)

    def trajectory(self, i: int) -> dict[str, Any]:
        """Visible trajectory ``i`` (0 = oldest kept, negative from the newest; an integer,
        ``TypeError`` otherwise) as nested ``[T, B, ...]`` numpy arrays, plus
        ``trajectory_id``, ``max_episode_length`` and ``model_weights_id``."""
        return trajectory_dict(self.core.trajectory(as_int(i, "trajectory")))
