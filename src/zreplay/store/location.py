"""Where a buffer lives: the one place that picks a store backend for a path or URL.

A local path becomes a :class:`~zreplay.store.backend_local.LocalPath` (a ``pathlib.Path``
of the local backend); a URL an :class:`~zreplay.store.backend.ObjectLocation`
(``scheme://bucket/key``) of an object-store backend: ``s3://`` (or ``s3a://``) of the
S3 backend (obstore, ranged reads, whole shard writes), any other fsspec URL of an fsspec
backend (zarr-python arrays).  Everything below works through the location's
``.backend`` (see :mod:`zreplay.store.backend`); ``str(location)`` is the path or URL,
which ``locate`` (with the backend's ``storage_options``) takes back to an equal location.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .backend import ObjectLocation
from .backend_fsspec import FsspecBackend
from .backend_local import LocalPath
from .backend_s3 import S3Backend

Location = LocalPath | ObjectLocation
S3_PROTOCOLS = ("s3", "s3a")


def is_url(path: Any) -> bool:
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


def locate(path: str | os.PathLike | Location, storage_options: Mapping | None = None) -> Location:
    """``path`` as a location: a location as it is; a ``file://`` URL or a local path
    (``str``/``os.PathLike``) on the local backend; an ``s3://``/``s3a://`` URL on the S3
    backend and any other URL on an fsspec backend, reached with ``storage_options``."""
    if hasattr(path, "backend"):
        return path
    if isinstance(path, str) and path.startswith("file://"):
        return LocalPath(path[len("file://") :])
    if is_url(path):
        if path.split("://", 1)[0] in S3_PROTOCOLS:
            return S3Backend.for_url(path, storage_options)
        return FsspecBackend.for_url(path, storage_options)
    return LocalPath(path)
