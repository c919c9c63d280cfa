"""Locations: one type for every object store (``scheme://bucket/key``), whose path
arithmetic is ``PurePosixPath``'s on the key and whose ``str`` is the URL ``locate``
takes back; the one place (``locate``) that picks a backend."""

from __future__ import annotations

import uuid
from pathlib import PurePosixPath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zreplay.store.backend import ObjectLocation
from zreplay.store.backend_fsspec import FsspecBackend
from zreplay.store.backend_local import LocalBackend, LocalPath
from zreplay.store.backend_s3 import S3Backend
from zreplay.store.location import locate

OPTIONS = {"endpoint_url": "http://127.0.0.1:1", "key": "k", "secret": "s"}  # never reached
segment = st.text("abcxyz019._-", min_size=1, max_size=6).filter(lambda s: s not in (".", ".."))
keys = st.lists(segment, min_size=0, max_size=5).map("/".join)
# Names as relative paths are (a leading "/" does not make one absolute: see below).
names = (
    st.lists(st.sampled_from(["a", "b.json", "c_1", ".", ""]) | segment, max_size=3)
    .map("/".join)
    .filter(lambda s: not s.startswith("/"))
)
schemes = st.sampled_from(["s3://bucket", "s3a://bkt-2", "memory://top"])


def pure(key: str) -> str:
    """``PurePosixPath``'s spelling of a relative key ('' for the root, not '.')."""
    s = str(PurePosixPath(key))
    return "" if s == "." else s


def at(base: str, key: str) -> ObjectLocation:
    loc = locate(f"{base}/{key}", OPTIONS if base.startswith("s3") else None)
    assert isinstance(loc, ObjectLocation)
    return loc


@settings(max_examples=200)
@given(schemes, keys, names)
def test_joining_agrees_with_pure_posix_path(base, key, name):
    loc = at(base, key)
    assert loc.key == pure(key)
    joined = loc / name
    assert joined.key == pure(str(PurePosixPath(key or ".", name)))
    assert (joined.backend, joined.bucket) == (loc.backend, loc.bucket)
    assert loc / f"/{name}" == joined  # keys are relative: a name never leaves the bucket


@settings(max_examples=200)
@given(schemes, keys)
def test_name_and_parent_agree_with_pure_posix_path(base, key):
    loc, p = at(base, key), PurePosixPath(key)
    assert loc.name == p.name
    assert loc.parent.key == pure(str(p.parent))
    assert loc.parent.bucket == loc.bucket  # the bucket is the root: never left
    if loc.key:
        assert loc.with_name("z.json").key == pure(str(p.with_name("z.json")))


@settings(max_examples=200)
@given(schemes, keys, keys)
def test_relative_to_agrees_with_pure_posix_path(base, key, below):
    loc = at(base, key)
    inner = loc / below
    got = inner.relative_to(loc)
    assert got == PurePosixPath(inner.key).relative_to(PurePosixPath(loc.key or "."))
    assert loc / str(got) == inner
    if below:
        with pytest.raises(ValueError):
            loc.relative_to(inner)


@settings(max_examples=200)
@given(schemes, keys)
def test_the_url_goes_round(base, key):
    loc = at(base, key)
    again = locate(str(loc), loc.backend.storage_options)
    assert again == loc and str(again) == str(loc) and hash(again) == hash(loc)
    assert (again.scheme, again.bucket, again.key) == (loc.scheme, loc.bucket, loc.key)


def test_url_forms_are_those_of_before():
    s3 = locate("s3://bucket/a/b", OPTIONS)
    assert str(s3) == "s3://bucket/a/b" and (s3.bucket, s3.key) == ("bucket", "a/b")
    assert str(s3.parent.parent) == "s3://bucket/"  # a bucket's root, as S3 spells it
    assert str(locate("s3a://b2/x/", OPTIONS)) == "s3a://b2/x"
    mem = locate("memory://top/x/y")
    assert str(mem) == "memory://top/x/y" and mem.path == "top/x/y"
    assert str(mem.parent.parent) == "memory://top"  # as fsspec spells a bucket
    assert str(mem.parent.parent.parent) == "memory://top"


def test_locate_picks_the_backend_and_keeps_storage_options(tmp_path):
    s3 = locate("s3://bucket/a", OPTIONS)
    assert isinstance(s3.backend, S3Backend) and s3.backend.storage_options == OPTIONS
    assert locate("s3://bucket/b", dict(OPTIONS)).backend is s3.backend  # one client
    assert locate("s3://bucket/a", {**OPTIONS, "key": "other"}).backend is not s3.backend
    assert isinstance(locate("s3a://bucket/a", OPTIONS).backend, S3Backend)
    mem = locate("memory://top/a")
    assert isinstance(mem.backend, FsspecBackend) and type(mem) is type(s3)  # one type
    local = locate(str(tmp_path / "b"))
    assert isinstance(local, LocalPath) and isinstance(local.backend, LocalBackend)
    assert locate(f"file://{tmp_path}/b") == local
    assert locate(local) is local and locate(s3) is s3
    assert locate(str(local)) == local  # a local path's str goes round too


def test_an_object_locations_files_go_through_its_backend():
    root = locate(f"memory://zreplay-test-{uuid.uuid4().hex}/buf")
    f = root / "seg" / "commit.json"
    assert not f.exists() and not root.is_dir() and list(root.iterdir()) == []
    f.write_bytes(b"{}")
    (root / "zarr.json").write_bytes(b"[]")
    assert f.read_text() == "{}" and f.is_file() and not f.is_dir()
    assert root.is_dir() and not root.is_file() and root.exists()
    assert [c.name for c in root.iterdir()] == ["seg", "zarr.json"]
    assert dict(root.backend.walk_files(root)) == {
        "seg/commit.json": f,
        "zarr.json": root / "zarr.json",
    }
    root.backend.move_tree(root / "seg", root / "moved")
    assert (root / "moved" / "commit.json").read_bytes() == b"{}" and not f.exists()
    (root / "zarr.json").unlink()
    with pytest.raises(FileNotFoundError):
        (root / "zarr.json").unlink()
    (root / "zarr.json").unlink(missing_ok=True)
    root.backend.remove_tree(root)
    assert not root.exists()
