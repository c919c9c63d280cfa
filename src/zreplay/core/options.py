"""The options every facade takes, declared and documented once: the store options of
every writable buffer (:class:`StoreOptions`) and the reader options of every read-only
view (:class:`ReaderOptions`).

:class:`~zreplay.TrajectoryReplayBuffer`, :class:`~zreplay.ReplayBuffer` and
``zreplay.torchrl.ZarrStorage`` each declare their own ecosystem's arguments and take
these as keywords (``**store: Unpack[StoreOptions]``), with the same names, meanings and
defaults everywhere; :func:`store_options` checks what a facade was given and fills the
defaults, and :meth:`BufferCore.writer <zreplay.core.BufferCore.writer>` applies them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from .rate import RateLimiter, check_rate_options

DEFAULT_RAM_BYTES = 1 << 30  # the RAM tier of a persistent buffer


class StoreOptions(TypedDict, total=False):
    """Keyword options of every writable buffer (all optional).

    Attributes:
        writer_id: name of this writer's segment (default ``"default"``); a buffer may
            have many writers, each on its own segment, and a segment has one writer.
        durable: fsync what a commit names before publishing it (default ``True``:
            power-loss safety; ``False`` trades it for speed).
        overwrite: start afresh even if the path holds a buffer (default ``False``: an
            existing buffer is resumed).
        break_lock: take over a writer lock left by a dead writer on another host
            (default ``False``; a lock of this host is judged by itself).
        layout: per-key chunk, shard and codec overrides, e.g.
            ``{"curr_obs/main_images": {"codec": "zstd", "level": 3}}``.
        storage_options: fsspec/s3fs options for an ``s3://`` path (``endpoint_url``,
            ``key``, ``secret``, ...).
        ram_budget_bytes: cap on the committed rows kept decoded in RAM (the RAM tier;
            older rows are read from the store); ``None``: no cap in bytes.  Default
            1 GiB, except for ``TrajectoryReplayBuffer``, whose RAM tier holds its
            ``cache_size`` newest trajectories as RLinf's cache does (its whole sampling
            window, at most 2 GiB, when ``auto_save=False``).
        staging_bytes: RAM for added rows waiting for the background writer beyond the
            RAM tier (default 256 MiB, at most 1/16 of RAM): adds wait for the writer only
            once the uncommitted rows fill the RAM tier plus this budget.  The RAM tier's
            ring is the larger of ``ram_budget_bytes`` and room for two of the largest
            trajectories (one, if ``staging_bytes`` holds less); a batch larger than that
            is held whole until it is committed, then the memory is given back.
        rate_limiter: ``zreplay.MinSize`` / ``zreplay.SampleToInsertRatio``: adds wait
            while this writer runs ahead of the learners that declared themselves, and
            (with ``learner_id``) this buffer's samples wait as a learner's.
        learner_id: declare this buffer a learner of the rate limiter (its sample count
            is published under that name and resumed from it).
    """

    writer_id: str
    durable: bool
    overwrite: bool
    break_lock: bool
    layout: Mapping[str, Mapping] | None
    storage_options: Mapping | None
    ram_budget_bytes: int | None
    staging_bytes: int | None
    rate_limiter: RateLimiter | None
    learner_id: str | None


DEFAULTS: dict[str, Any] = {
    "writer_id": "default",
    "durable": True,
    "overwrite": False,
    "break_lock": False,
    "layout": None,
    "storage_options": None,
    "ram_budget_bytes": DEFAULT_RAM_BYTES,
    "staging_bytes": None,
    "rate_limiter": None,
    "learner_id": None,
}
assert set(DEFAULTS) == set(StoreOptions.__annotations__)


def store_options(facade: str, given: Mapping[str, Any], **defaults: Any) -> dict[str, Any]:
    """Every store option for ``facade`` (its class name, for the error): ``given``
    over the facade's own ``defaults`` (as documented above) over :data:`DEFAULTS`;
    ``TypeError`` for a name that is not a store option, as Python's own for an
    unexpected keyword argument, with the names there are; a ``rate_limiter`` that is
    not one and an unsafe ``learner_id`` are refused here too, before anything is
    made (or, with ``overwrite=True``, removed)."""
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise TypeError(
            f"{facade}() got an unexpected keyword argument {unknown[0]!r}; its store "
            f"options (zreplay.StoreOptions) are {', '.join(DEFAULTS)}"
        )
    check_rate_options(given.get("rate_limiter"), given.get("learner_id"))
    return {**DEFAULTS, **defaults, **given}


class ReaderOptions(TypedDict, total=False):
    """Keyword options of every read-only view (``zreplay.open``, ``BufferView``; all
    optional).  A view pickles as exactly these (:func:`reader_options`), so each one
    reaches DataLoader workers.

    Attributes:
        storage_options: fsspec/s3fs options for an ``s3://`` path (``endpoint_url``,
            ``key``, ``secret``, ...).
        column_cache_bytes: bytes per segment of small keys (rows <= 1 KiB: flags,
            rewards, actions, states) kept decoded in a local file every process reading
            the segment maps (default: the machine's RAM; 0: off).
        chunk_cache_bytes: bytes per segment of the other keys (images) kept decoded:
            for a local buffer their newest rows in a second column cache file (not with
            ``column_cache_bytes=0``), and decoded chunks of the rows read from the store
            in this process's memory (default: a sixteenth of the machine's RAM; 0: none).
    """

    storage_options: Mapping | None
    column_cache_bytes: int | None
    chunk_cache_bytes: int | None


READER_DEFAULTS: dict[str, Any] = {
    "storage_options": None,
    "column_cache_bytes": None,
    "chunk_cache_bytes": None,
}
assert set(READER_DEFAULTS) == set(ReaderOptions.__annotations__)


def reader_options(facade: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """Every reader option for ``facade`` (its class name, for the error): ``given``
    over :data:`READER_DEFAULTS`; ``TypeError`` for a name that is not one."""
    unknown = sorted(set(given) - set(READER_DEFAULTS))
    if unknown:
        raise TypeError(
            f"{facade}() got an unexpected keyword argument {unknown[0]!r}; its reader "
            f"options (zreplay.core.options.ReaderOptions) are {', '.join(READER_DEFAULTS)}"
        )
    return {**READER_DEFAULTS, **given}
