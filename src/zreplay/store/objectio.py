"""Requests to an S3 bucket: the seven calls every byte of an ``s3://`` buffer goes through.

An :class:`ObjectClient` offers ``get`` (whole objects, byte ranges and suffixes, all at
once), ``put`` (whole objects, all at once), ``create`` (a conditional PUT), ``delete``,
``list``, ``head`` and ``copy``, and raises only ``OSError`` subclasses:
``FileNotFoundError`` for a missing object, ``FileExistsError`` for a lost conditional
PUT, ``PermissionError`` for refused or missing credentials,
:class:`~zreplay.errors.NoSuchBucketError` for a bucket that does not exist, ``OSError`` for the rest.  Each is raised with no
chained cause: the message says it all (the store's own error, often an XML body spread
over many lines, stays out of the user's traceback).

Two clients, chosen per process by :class:`~zreplay.store.backend_s3.S3Backend`:

* :class:`ObstoreClient` (obstore, Rust's ``object_store``): many concurrent requests on
  one asyncio loop in a daemon thread, about 0.1 ms of Python per request.
* :class:`S3fsClient` (s3fs) in a process forked from another: obstore's runtime hangs in
  a forked child (measured), s3fs starts a fresh loop there.

:func:`obstore_settings` maps s3fs-style ``storage_options`` (``endpoint_url``, ``key``,
``secret``, ``token``, ``client_kwargs.region_name``, ``anon``, ``profile``) and the AWS
environment onto obstore's configuration, so both clients reach the same bucket.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import errno
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import CorruptBufferError, NoSuchBucketError
from ..forks import at_fork
from .backend import too_big_to_read

# A request: (key, None) the whole object, (key, (start, end)) bytes [start, end),
# (key, (start, None)) from start on, (key, (-n, None)) the last n bytes.
Request = tuple[str, tuple[int, int | None] | None]
CONCURRENCY = 64


class LoopReentryError(RuntimeError):
    """A blocking S3 request made on the S3 event loop's own thread."""


def _no_such_bucket(text: str) -> bool:
    """Whether a store's error text is S3's NoSuchBucket (obstore and botocore both keep
    the S3 error code in the message)."""
    return "NoSuchBucket" in text or "bucket does not exist" in text


class _Loop:
    """One asyncio loop in a daemon thread (per process)."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="zreplay-s3", daemon=True)
        self.thread.start()

    def run(self, coro):
        if threading.current_thread() is self.thread:
            # Code run on the loop's own thread (a finalizer the garbage collector ran
            # there) would wait for a request the loop can never serve: fail instead.
            coro.close()
            raise LoopReentryError(
                "a blocking S3 request was made on zreplay's S3 event-loop thread, which "
                "would wait on itself; make it from another thread"
            )
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


_LOOP: _Loop | None = None
_LOOP_LOCK = threading.Lock()


def _forget_loop() -> None:
    # The loop's thread did not come along, and another parent thread may have held the
    # lock at the fork.
    global _LOOP, _LOOP_LOCK
    _LOOP, _LOOP_LOCK = None, threading.Lock()


at_fork(_forget_loop)


def shared_loop() -> _Loop:
    """This process's one event loop for S3 requests (started on first use; a forked
    child starts its own)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = _Loop()
        return _LOOP


async def _bounded(coros: Sequence) -> list:
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(c):
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))


def _env(*names: str) -> str | None:
    for n in names:
        if os.environ.get(n):
            return os.environ[n]
    return None


def endpoint_of(options: Mapping) -> str | None:
    """The endpoint URL the options (or the AWS environment) name, if any."""
    ck = options.get("client_kwargs") or {}
    return (
        options.get("endpoint_url")
        or ck.get("endpoint_url")
        or _env("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")
    )


class _BotocoreCredentials:
    """Credentials from botocore's chain (profiles, ``~/.aws`` files, SSO, instance and
    container roles), which obstore does not read itself; refreshed every 5 minutes."""

    def __init__(self, profile: str | None):
        self.profile = profile
        self._session = None
        # What the last call raised: obstore only passes on its text, inside a longer
        # message of its own; the client raises this instead.
        self.failure: PermissionError | None = None

    def __call__(self) -> dict:
        import botocore.session  # comes with s3fs

        if self._session is None:
            self._session = botocore.session.Session(profile=self.profile)
        creds = self._session.get_credentials()
        if creds is None:
            self.failure = PermissionError(
                errno.EACCES,
                "no AWS credentials found: pass storage_options={'key': ..., 'secret': ...}, "
                "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, configure a profile, or pass "
                "storage_options={'anon': True} for a public bucket",
            )
            raise self.failure
        self.failure = None
        f = creds.get_frozen_credentials()
        soon = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
        return {
            "access_key_id": f.access_key,
            "secret_access_key": f.secret_key,
            "token": f.token,
            "expires_at": soon,
        }


def obstore_settings(options: Mapping) -> tuple[dict, dict, Any]:
    """``(config, client_options, credential_provider)`` for ``obstore.store.S3Store``
    from s3fs-style storage options; what they leave out obstore reads from ``AWS_*``
    environment variables, and credentials neither gives come from botocore's chain."""
    ck = options.get("client_kwargs") or {}
    config: dict[str, Any] = {}
    endpoint = endpoint_of(options)
    if endpoint:
        config["endpoint"] = endpoint
    region = ck.get("region_name") or options.get("region_name")
    region = region or _env("AWS_REGION", "AWS_DEFAULT_REGION")
    if region:
        config["region"] = region
    elif endpoint:
        config["region"] = "us-east-1"  # MinIO, moto and most S3-compatible stores take any
    for ours, theirs in (("key", "access_key_id"), ("secret", "secret_access_key")):
        if options.get(ours):
            config[theirs] = options[ours]
    if options.get("token"):
        config["session_token"] = options["token"]
    anon = bool(options.get("anon"))
    if anon:
        config["skip_signature"] = True
    style = ((options.get("config_kwargs") or {}).get("s3") or {}).get("addressing_style")
    if style == "virtual":
        config["virtual_hosted_style_request"] = True
    if options.get("requester_pays"):
        config["request_payer"] = True
    client: dict[str, Any] = {}
    if endpoint and endpoint.startswith("http://"):
        client["allow_http"] = True
    provider = None
    if not anon and "access_key_id" not in config and not _env("AWS_ACCESS_KEY_ID"):
        if not _env("AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
            try:
                import botocore  # noqa: F401
            except ImportError:
                pass
            else:
                provider = _BotocoreCredentials(options.get("profile"))
    return config, client, provider


def _obstore_error(e: BaseException, key: str, bucket: str, provider=None) -> OSError:
    from obstore import exceptions as ex

    msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if isinstance(e, OSError):
        return e
    if _no_such_bucket(str(e)):
        return NoSuchBucketError(bucket)
    failure = getattr(provider, "failure", None)
    if failure is not None and isinstance(e, ex.UnauthenticatedError | ex.GenericError):
        return PermissionError(failure.errno, failure.strerror, key)
    if isinstance(e, ex.NotFoundError):
        return FileNotFoundError(errno.ENOENT, "no such object", key)
    if isinstance(e, ex.AlreadyExistsError | ex.PreconditionError):
        return FileExistsError(errno.EEXIST, "object exists", key)
    if isinstance(e, ex.PermissionDeniedError | ex.UnauthenticatedError):
        return PermissionError(errno.EACCES, msg, key)
    return OSError(errno.EIO, msg, key)


class ObjectClient:
    """The requests of one process to one bucket (see the module docstring)."""

    def get(
        self, requests: Sequence[Request], missing_ok: bool = False, limit: int | None = None
    ) -> list:
        """Bodies (buffers) of ``requests``, fetched concurrently, in order; a missing
        object is FileNotFoundError, or None with ``missing_ok``.  With ``limit``, a whole
        object (no range) of more than ``limit`` bytes is CorruptBufferError, raised
        before its body is read (a record of a buffer that may come from a stranger)."""
        raise NotImplementedError

    def put(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Store every ``(key, data)`` (whole objects, concurrently)."""
        raise NotImplementedError

    def create(self, key: str, data: bytes) -> bool:
        """Store ``data`` at ``key`` only if nothing is there (False if something is)."""
        raise NotImplementedError

    def delete(self, keys: Sequence[str]) -> None:
        """Delete ``keys`` (missing ones are fine)."""
        raise NotImplementedError

    def list(self, prefix: str, recursive: bool) -> tuple[list[tuple[str, int]], list[str]]:
        """``([(key, size)], [sub-prefix])`` under ``prefix`` (ending with '/'): every
        object below it if ``recursive``, else the objects and sub-prefixes of one level."""
        raise NotImplementedError

    def head(self, key: str) -> int:
        """The size of object ``key``; FileNotFoundError if there is none."""
        raise NotImplementedError

    def etags(self, prefix: str) -> dict[str, tuple[str, int]]:
        """``{key: (ETag, size)}`` of every object below ``prefix`` (ending with '/')."""
        raise NotImplementedError

    def copy(self, src: str, dst: str) -> None:
        """Copy object ``src`` to ``dst`` inside the bucket (server-side)."""
        raise NotImplementedError


class ObstoreClient(ObjectClient):
    def __init__(self, bucket: str, options: Mapping):
        import obstore
        from obstore.store import S3Store

        config, client, provider = obstore_settings(options)
        self.ob, self.bucket, self.provider = obstore, bucket, provider
        self.store = S3Store(
            bucket, config=config, client_options=client or None, credential_provider=provider
        )

    def _run(self, fn, key: str):
        """Run ``fn()`` (a coroutine function: obstore's calls need a running loop)."""
        try:
            return shared_loop().run(fn())
        except (LoopReentryError, CorruptBufferError):
            raise
        except Exception as e:  # noqa: BLE001 - obstore raises its own exception types
            raise _obstore_error(e, key, self.bucket, self.provider) from None

    async def _get(self, key: str, rng, missing_ok: bool, limit: int | None = None) -> Any:
        ob, st = self.ob, self.store
        try:
            if rng is None:
                got = await ob.get_async(st, key)
                size = int(got.meta["size"])  # known before the body is read
                if limit is not None and size > limit:
                    raise too_big_to_read(f"s3://{self.bucket}/{key}", size, limit)
                return await got.bytes_async()
            start, end = rng
            if start < 0:
                r = await ob.get_async(st, key, options={"range": {"suffix": -start}})
                return await r.bytes_async()
            if end is None:
                r = await ob.get_async(st, key, options={"range": {"offset": start}})
                return await r.bytes_async()
            return await ob.get_range_async(st, key, start=start, end=end)
        except CorruptBufferError:
            raise
        except Exception as e:  # noqa: BLE001 - mapped to OSError subclasses
            err = _obstore_error(e, key, self.bucket, self.provider)
            if missing_ok and isinstance(err, FileNotFoundError):
                return None
            raise err from None

    def get(
        self, requests: Sequence[Request], missing_ok: bool = False, limit: int | None = None
    ) -> list:
        if not requests:
            return []

        async def go():
            return await _bounded([self._get(k, r, missing_ok, limit) for k, r in requests])

        return self._run(go, requests[0][0])

    def put(self, items: Sequence[tuple[str, bytes]]) -> None:
        if not items:
            return

        async def go():
            await _bounded([self.ob.put_async(self.store, k, v) for k, v in items])

        self._run(go, items[0][0])

    def create(self, key: str, data: bytes) -> bool:
        async def go():
            await self.ob.put_async(self.store, key, data, mode="create")

        try:
            self._run(go, key)
        except FileExistsError:
            return False
        return True

    def delete(self, keys: Sequence[str]) -> None:
        if not keys:
            return

        async def go():
            await self.ob.delete_async(self.store, list(keys))

        self._run(go, keys[0])

    def list(self, prefix: str, recursive: bool):
        async def go():
            if not recursive:
                got = await self.ob.list_with_delimiter_async(self.store, prefix)
                objs = [(o["path"], int(o["size"])) for o in got["objects"]]
                return objs, [p.rstrip("/") + "/" for p in got["common_prefixes"]]
            objs = []
            async for batch in self.ob.list(self.store, prefix, chunk_size=1000):
                objs += [(o["path"], int(o["size"])) for o in batch]
            return objs, []

        return self._run(go, prefix)

    def head(self, key: str) -> int:
        async def go():
            return await self.ob.head_async(self.store, key)

        return int(self._run(go, key)["size"])

    def etags(self, prefix: str) -> dict[str, tuple[str, int]]:
        async def go():
            out = {}
            async for batch in self.ob.list(self.store, prefix, chunk_size=1000):
                out.update({o["path"]: (o.get("e_tag") or "", int(o["size"])) for o in batch})
            return out

        return self._run(go, prefix)

    def copy(self, src: str, dst: str) -> None:
        async def go():
            await self.ob.copy_async(self.store, src, dst)

        self._run(go, src)


class S3fsClient(ObjectClient):
    """The same requests through s3fs (for processes forked from another)."""

    def __init__(self, bucket: str, options: Mapping):
        import fsspec

        opts = {**options, "use_listings_cache": False, "skip_instance_cache": True}
        self.fs = fsspec.filesystem("s3", **opts)
        self.bucket = bucket

    def _p(self, key: str) -> str:
        return f"{self.bucket}/{key}"

    def _run(self, coro, key: str):
        from fsspec.asyn import sync

        async def go():
            return await coro

        try:
            return sync(self.fs.loop, go)
        except CorruptBufferError:
            raise
        except Exception as e:  # noqa: BLE001 - botocore raises its own exception types
            if _no_such_bucket(f"{e} {e.__cause__}"):
                raise NoSuchBucketError(self.bucket) from None
            if isinstance(e, OSError):
                raise
            raise OSError(errno.EIO, f"{type(e).__name__}: {e}", key) from None

    async def _get(self, key: str, rng, missing_ok: bool, limit: int | None = None):
        try:
            if rng is None:
                if limit is not None:  # (this fallback client: a HEAD first)
                    size = int((await self.fs._info(self._p(key), refresh=True))["size"])
                    if size > limit:
                        raise too_big_to_read(f"s3://{self.bucket}/{key}", size, limit)
                return await self.fs._cat_file(self._p(key))
            start, end = rng
            return await self.fs._cat_file(self._p(key), start=start, end=end)
        except FileNotFoundError:
            if missing_ok:
                return None
            raise

    def get(
        self, requests: Sequence[Request], missing_ok: bool = False, limit: int | None = None
    ) -> list:
        if not requests:
            return []
        gets = [self._get(k, r, missing_ok, limit) for k, r in requests]
        return self._run(_bounded(gets), requests[0][0])

    def put(self, items: Sequence[tuple[str, bytes]]) -> None:
        if items:
            puts = [self.fs._pipe_file(self._p(k), v) for k, v in items]
            self._run(_bounded(puts), items[0][0])

    def create(self, key: str, data: bytes) -> bool:
        try:
            self._run(self.fs._pipe_file(self._p(key), data, mode="create"), key)
        except FileExistsError:
            return False
        return True

    def delete(self, keys: Sequence[str]) -> None:
        if keys:
            self._run(self.fs._rm([self._p(k) for k in keys]), keys[0])

    def list(self, prefix: str, recursive: bool):
        n = len(self.bucket) + 1
        try:
            if recursive:
                found = self._run(self.fs._find(self._p(prefix), detail=True), prefix)
                return [(p[n:], int(i.get("size") or 0)) for p, i in found.items()], []
            found = self._run(self.fs._ls(self._p(prefix), detail=True, refresh=True), prefix)
        except FileNotFoundError:
            return [], []
        objs = [(i["name"][n:], int(i.get("size") or 0)) for i in found if i["type"] == "file"]
        dirs = [i["name"][n:].rstrip("/") + "/" for i in found if i["type"] != "file"]
        return objs, dirs

    def head(self, key: str) -> int:
        info = self._run(self.fs._info(self._p(key), refresh=True), key)
        if info.get("type") != "file":
            raise FileNotFoundError(errno.ENOENT, "no such object", key)
        return int(info["size"])

    def etags(self, prefix: str) -> dict[str, tuple[str, int]]:
        n = len(self.bucket) + 1
        try:
            found = self._run(self.fs._find(self._p(prefix), detail=True), prefix)
        except FileNotFoundError:
            return {}
        return {p[n:]: (i.get("ETag") or "", int(i.get("size") or 0)) for p, i in found.items()}

    def copy(self, src: str, dst: str) -> None:
        self._run(self.fs._copy(self._p(src), self._p(dst)), src)
