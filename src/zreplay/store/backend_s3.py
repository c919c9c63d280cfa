"""The S3 backend (``s3://bucket/prefix``, AWS, MinIO, moto): obstore requests, arrays read
by byte ranges and written a whole shard per PUT.

* Every request goes through seven methods of :class:`S3Backend`: :meth:`~S3Backend.get`,
  :meth:`~S3Backend.put`, :meth:`~S3Backend.create`, :meth:`~S3Backend.delete`,
  :meth:`~S3Backend.list`, :meth:`~S3Backend.head` and :meth:`~S3Backend.copy` (a fault
  harness wraps these); they raise ``OSError`` subclasses only.  They use obstore, or
  s3fs in a process forked from another (obstore hangs there; see
  :mod:`zreplay.store.objectio`).
* publish: one PUT (atomic in S3); exclusive create: a conditional PUT
  (``If-None-Match: *``); copies: server-side; no flock (the guard is a no-op) and no
  temp files (objects appear whole).
* arrays: :class:`~zreplay.store.objectarray.ObjectArray` (cached shard indexes, one
  or two rounds of concurrent ranged GETs per read; one PUT per touched shard per write).
  An array whose codecs it does not handle is read with zarr-python instead.
* storage options are s3fs's (``endpoint_url``, ``key``, ``secret``, ``token``,
  ``client_kwargs={"region_name": ...}``, ``anon``, ``profile``); without them the AWS
  environment variables and config files apply.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..forks import at_fork, forked, on_fork
from .arrays import ZarrArray
from .backend import (
    MAX_READ_BYTES,
    ObjectBackend,
    ObjectLocation,
    TooBigToRead,
    max_copy_bytes,
    too_big_to_copy,
    too_big_to_read,
)
from .objectarray import ShardCache
from .objectio import ObjectClient, Request

_BACKENDS: dict[tuple, S3Backend] = {}
_BACKENDS_LOCK = threading.Lock()


def _new_backends_lock() -> None:
    global _BACKENDS_LOCK
    _BACKENDS_LOCK = threading.Lock()  # another parent thread may have held it at the fork


at_fork(_new_backends_lock)


class S3Backend(ObjectBackend):
    """One bucket, reached with s3fs-style ``storage_options`` (see the module docstring)."""

    # A commit re-uploads every shard it touches and the index chunks: few large commits.
    commit_tier_share = 1.0

    def __init__(self, protocol: str, bucket: str, storage_options: Mapping[str, Any]):
        self.protocol, self.bucket = protocol, bucket
        self._options = dict(storage_options)
        self._client: ObjectClient | None = None
        self._lock = threading.Lock()
        on_fork(self, S3Backend._forget_client)

    def _forget_client(self) -> None:
        # obstore's runtime hangs in a forked child: the child makes its own client, and
        # another parent thread may have held the lock at the fork.
        self._client, self._lock = None, threading.Lock()

    @classmethod
    def for_url(cls, url: str, storage_options: Mapping | None) -> ObjectLocation:
        protocol, rest = url.split("://", 1)
        bucket, _, key = rest.partition("/")
        options = dict(storage_options or {})
        options.pop("use_listings_cache", None)  # s3fs's; nothing is cached here
        try:
            token = json.dumps(options, sort_keys=True)
        except TypeError:
            token = repr(sorted(options.items()))
        with _BACKENDS_LOCK:  # one client (connection pool) per bucket and options
            backend = _BACKENDS.get((protocol, bucket, token))
            if backend is None:
                backend = _BACKENDS[(protocol, bucket, token)] = cls(protocol, bucket, options)
        return ObjectLocation(backend, bucket, key)

    @property
    def storage_options(self) -> dict:
        return dict(self._options)

    # -- the requests (every I/O of this backend) ------------------------------------

    def client(self) -> ObjectClient:
        """This process's client: obstore, or s3fs in a forked child (or without obstore)."""
        with self._lock:
            if self._client is None:
                from .objectio import ObstoreClient, S3fsClient

                use_s3fs = forked()
                if not use_s3fs:
                    try:
                        import obstore  # noqa: F401
                    except ImportError:
                        use_s3fs = True
                kind = S3fsClient if use_s3fs else ObstoreClient
                self._client = kind(self.bucket, self._options)
            return self._client

    def get(
        self, requests: Sequence[Request], missing_ok: bool = False, limit: int | None = None
    ) -> list:
        """Objects or byte ranges, fetched concurrently (see ``ObjectClient.get``)."""
        return self.client().get(requests, missing_ok, limit)

    def put(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Whole objects, stored concurrently."""
        self.client().put(items)

    def create(self, key: str, data: bytes) -> bool:
        """A conditional PUT: False if ``key`` exists."""
        return self.client().create(key, data)

    def delete(self, keys: Sequence[str]) -> None:
        self.client().delete(keys)

    def list(self, prefix: str, recursive: bool) -> tuple[list[tuple[str, int]], list[str]]:
        return self.client().list(prefix, recursive)

    def head(self, key: str) -> int:
        return self.client().head(key)

    def etags(self, prefix: str) -> dict[str, tuple[str, int]]:
        return self.client().etags(prefix)

    def copy(self, src: str, dst: str) -> None:
        self.client().copy(src, dst)

    # -- one object -------------------------------------------------------------------

    def read_object(self, loc) -> bytes:
        return self._whole(loc, MAX_READ_BYTES, too_big_to_read)

    def read_data(self, loc) -> bytes:
        return self._whole(loc, max_copy_bytes(), too_big_to_copy)

    def _whole(self, loc, limit: int, too_big) -> bytes:
        """The object ``loc`` read whole, refused (``too_big``) over ``limit`` bytes from
        the size its GET declares, before its body is read."""
        try:
            body = self.get([(loc.key, None)], limit=limit)[0]
        except TooBigToRead as e:  # (the client's, by key: named here by location)
            raise too_big(loc, e.size, limit) from None
        if len(body) > limit:  # (grown since its size was read)
            raise too_big(loc, len(body), limit)
        return bytes(body)

    def write_object(self, loc, data: bytes) -> None:
        self.put([(loc.key, bytes(data))])

    def is_object(self, loc) -> bool:
        try:
            self.head(loc.key)
        except FileNotFoundError:
            return False
        return True

    def is_prefix(self, loc) -> bool:
        objs, dirs = self.list(loc.key + "/", recursive=False)
        return bool(objs or dirs)

    def child_names(self, loc) -> list[str]:
        objs, dirs = self.list(loc.key + "/", recursive=False)
        keys = {k for k, _ in objs} | {d.rstrip("/") for d in dirs}
        return sorted(k.rpartition("/")[2] for k in keys if k.strip("/") != loc.key)

    def unlink_object(self, loc, missing_ok: bool) -> None:
        if not missing_ok:
            self.head(loc.key)  # FileNotFoundError if it is not there
        self.delete([loc.key])

    def copy_object(self, src, dst) -> None:
        self.copy(src.key, dst.key)

    # -- files --------------------------------------------------------------------

    def tree_stamps(self, loc) -> dict[str, tuple[int, int, int]] | None:
        """One listing: an object's ETag (of its bytes, for a whole-object PUT) and size."""
        prefix = loc.key + "/"
        try:
            found = self.etags(prefix)
        except OSError:
            return None
        out = {}
        for key, (tag, size) in found.items():
            if tag and key.startswith(prefix):
                digest = hashlib.sha256(tag.encode()).digest()
                out[key[len(prefix) :]] = (int.from_bytes(digest[:7], "little"), 0, size)
        return out

    def publish(self, loc, data: bytes, durable: bool) -> None:
        self.put([(loc.key, bytes(data))])

    def create_exclusive(self, loc, data: bytes) -> bool:
        return self.create(loc.key, bytes(data))

    def remove_tree(self, loc) -> None:
        objs, _ = self.list(loc.key + "/", recursive=True)
        keys = [k for k, _ in objs]
        if loc.is_file():
            keys.append(loc.key)
        self.delete(keys)

    def walk_files(self, loc) -> Iterator[tuple[str, ObjectLocation]]:
        objs, _ = self.list(loc.key + "/", recursive=True)
        for key in sorted(k for k, _ in objs):
            yield key[len(loc.key) + 1 :], ObjectLocation(self, self.bucket, key)

    def du(self, loc) -> int:
        objs, _ = self.list(loc.key + "/", recursive=True)
        return sum(size for _, size in objs)

    # -- arrays -------------------------------------------------------------------

    def zarr_store(self, loc, read_only: bool = False):
        from .zarrbridge import BackendStore

        return BackendStore(loc, read_only=read_only)

    def array_context(self, durable: bool, cache_bytes: int = 0) -> ShardCache:
        return ShardCache(cache_bytes)  # shard indexes; decoded chunks up to cache_bytes

    def open_array(self, loc, writable: bool, context) -> tuple[object, bool]:
        from .objectarray import ObjectArray
        from .shards import ArrayMeta, UnsupportedArray

        raw = (loc / "zarr.json").read_bytes()
        try:
            meta = ArrayMeta.parse(raw, str(loc))
        except UnsupportedArray:
            return ZarrArray(loc, writable), True  # zarr-python reads what we do not
        return ObjectArray(self, loc.key, meta, writable, context), not meta.all_chunks_stored

    def observe_commit(self, context, n_rows: int, reclaimed_below: int, same_rows: bool) -> None:
        context.seen(n_rows, reclaimed_below, same_rows)
