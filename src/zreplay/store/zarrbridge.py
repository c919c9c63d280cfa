"""A zarr-python store over a backend's requests, so that what zreplay does with zarr-python
in an object store (creating arrays and groups, setting the root's attributes, reading an
array whose codecs :mod:`zreplay.store.shards` does not handle) goes through the same few
backend methods as everything else (``get``, ``put``, ``create``, ``delete``, ``list``,
``head``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

from zarr.abc.store import (
    ByteRequest,
    OffsetByteRequest,
    RangeByteRequest,
    Store,
    SuffixByteRequest,
)
from zarr.core.buffer import Buffer, BufferPrototype


class BackendStore(Store):
    """The keys under location ``root`` of an object-store backend as a zarr store."""

    supports_writes = True
    supports_deletes = True
    supports_partial_writes = False
    supports_listing = True

    def __init__(self, root, read_only: bool = False):
        super().__init__(read_only=read_only)
        self.root = root
        self.backend = root.backend

    def _key(self, key: str) -> str:
        return f"{self.root.key}/{key}" if key else self.root.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BackendStore) and str(other.root) == str(self.root)

    def __str__(self) -> str:
        return str(self.root)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        if byte_range is None:
            rng = None
        elif isinstance(byte_range, RangeByteRequest):
            rng = (byte_range.start, byte_range.end)
        elif isinstance(byte_range, OffsetByteRequest):
            rng = (byte_range.offset, None)
        elif isinstance(byte_range, SuffixByteRequest):
            rng = (-byte_range.suffix, None)
        else:
            raise TypeError(f"unexpected byte range {byte_range!r}")
        (got,) = await asyncio.to_thread(self.backend.get, [(self._key(key), rng)], missing_ok=True)
        return None if got is None else prototype.buffer.from_bytes(bytes(got))

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        return list(await asyncio.gather(*(self.get(k, prototype, r) for k, r in key_ranges)))

    async def exists(self, key: str) -> bool:
        try:
            await asyncio.to_thread(self.backend.head, self._key(key))
        except FileNotFoundError:
            return False
        return True

    async def set(self, key: str, value: Buffer) -> None:
        self._check_writable()
        await asyncio.to_thread(self.backend.put, [(self._key(key), value.to_bytes())])

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        self._check_writable()
        await asyncio.to_thread(self.backend.create, self._key(key), value.to_bytes())

    async def delete(self, key: str) -> None:
        self._check_writable()
        await asyncio.to_thread(self.backend.delete, [self._key(key)])

    async def _names(self, prefix: str, recursive: bool) -> list[str]:
        base = self._key(prefix).rstrip("/") + "/"
        objs, dirs = await asyncio.to_thread(self.backend.list, base, recursive)
        return [k[len(base) :] for k, _ in objs] + [d[len(base) :].rstrip("/") for d in dirs]

    async def list(self) -> AsyncIterator[str]:
        for name in await self._names("", True):
            yield name

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        for name in await self._names(base, True):
            full = f"{base}/{name}" if base else name
            if full.startswith(prefix):
                yield full

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        for name in await self._names(prefix, False):
            yield name
