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

import contextlib
import hashlib
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from . import objectswap
from .arrays import ZarrArray, forked
from .backend import Backend
from .objectarray import ShardCache
from .objectio import ObjectClient, Request

_BACKENDS: dict[tuple, S3Backend] = {}
_BACKENDS_LOCK = threading.Lock()


class S3Path:
    """A key in a bucket with the ``pathlib.Path`` subset zreplay uses; ``str()`` is the
    URL (``s3://bucket/key``), which zarr and s3fs accept with the storage options."""

    def __init__(self, backend: S3Backend, key: str):
        self.backend = backend
        self.key = key.strip("/")

    def _with(self, key: str) -> S3Path:
        return S3Path(self.backend, key)

    def __truediv__(self, name: str) -> S3Path:
        return self._with(f"{self.key}/{str(name).strip('/')}")

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> S3Path:
        return self._with(self.key.rsplit("/", 1)[0] if "/" in self.key else "")

    def with_name(self, name: str) -> S3Path:
        return self.parent / name

    def __str__(self) -> str:
        return f"{self.backend.protocol}://{self.backend.bucket}/{self.key}"

    def __repr__(self) -> str:
        return f"S3Path({str(self)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, S3Path) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __lt__(self, other: S3Path) -> bool:
        return str(self) < str(other)

    def resolve(self) -> S3Path:
        return self

    def read_bytes(self) -> bytes:
        return bytes(self.backend.get([(self.key, None)])[0])

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def write_bytes(self, data: bytes) -> None:
        self.backend.put([(self.key, bytes(data))])

    def is_file(self) -> bool:
        try:
            self.backend.head(self.key)
        except FileNotFoundError:
            return False
        return True

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def is_dir(self) -> bool:
        objs, dirs = self.backend.list(self.key + "/", recursive=False)
        return bool(objs or dirs)

    def iterdir(self) -> Iterator[S3Path]:
        objs, dirs = self.backend.list(self.key + "/", recursive=False)
        names = {k for k, _ in objs} | {d.rstrip("/") for d in dirs}
        return iter(self._with(n) for n in sorted(names) if n.strip("/") != self.key)

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Object stores have no directories: a prefix exists once an object is under it."""

    def unlink(self, missing_ok: bool = False) -> None:
        if not missing_ok:
            self.backend.head(self.key)  # FileNotFoundError if it is not there
        self.backend.delete([self.key])


class S3Backend(Backend):
    """One bucket, reached with s3fs-style ``storage_options`` (see the module docstring)."""

    # A commit re-uploads every shard it touches and the index chunks: few large commits.
    commit_tier_share = 1.0

    def __init__(self, protocol: str, bucket: str, storage_options: Mapping[str, Any]):
        self.protocol, self.bucket = protocol, bucket
        self._options = dict(storage_options)
        self._client: ObjectClient | None = None
        self._client_forked = False
        self._lock = threading.Lock()

    @classmethod
    def for_url(cls, url: str, storage_options: Mapping | None) -> S3Path:
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
        return S3Path(backend, key)

    @property
    def storage_options(self) -> dict:
        return dict(self._options)

    # -- the requests (every I/O of this backend) ------------------------------------

    def client(self) -> ObjectClient:
        """This process's client: obstore, or s3fs in a forked child (or without obstore)."""
        with self._lock:
            if self._client is None or (forked() and not self._client_forked):
                from .objectio import ObstoreClient, S3fsClient

                use_s3fs = forked()
                if not use_s3fs:
                    try:
                        import obstore  # noqa: F401
                    except ImportError:
                        use_s3fs = True
                kind = S3fsClient if use_s3fs else ObstoreClient
                self._client, self._client_forked = kind(self.bucket, self._options), forked()
            return self._client

    def get(self, requests: Sequence[Request], missing_ok: bool = False) -> list:
        """Objects or byte ranges, fetched concurrently (see ``ObjectClient.get``)."""
        return self.client().get(requests, missing_ok)

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

    def move_tree(self, src, dst) -> None:
        for rel, s in self.walk_files(src):  # no rename: server-side copies, then removal
            self.copy(s.key, (dst / rel).key)
        self.remove_tree(src)

    def remove_file(self, loc, up_to) -> None:
        self.delete([loc.key])  # no directories to leave behind

    def walk_files(self, loc) -> Iterator[tuple[str, S3Path]]:
        objs, _ = self.list(loc.key + "/", recursive=True)
        for key in sorted(k for k, _ in objs):
            yield key[len(loc.key) + 1 :], loc._with(key)

    def import_file(self, src, dst, link: bool = True) -> bool:
        if src.backend is self:
            self.copy(src.key, dst.key)
        else:
            dst.write_bytes(src.read_bytes())
        return False

    def remove_temps(self, loc, committed_shards: Mapping[str, int] | None = None) -> list:
        return []  # objects appear whole: no temp files are ever left

    def guard(self, loc, timeout: float | None = None) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def staged_tree(self, dest) -> contextlib.AbstractContextManager:
        return objectswap.staged(dest)  # no rename: staged, then rolled forward

    def recover_tree(self, loc) -> bool:
        return objectswap.recover(loc)

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
