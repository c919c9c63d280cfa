"""Key names, flattening and layout choices."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zreplay.errors import KeyNameError, SchemaError
from zreplay.schema import KeySpec, Schema, check_key_component, flatten, unflatten
from zreplay.store.layout import KeyLayout

safe = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,20}", fullmatch=True).filter(
    lambda s: s not in ("c", "zarr.json") and not s.endswith(".")
)


@given(
    st.dictionaries(
        safe, st.one_of(st.integers(), st.dictionaries(safe, st.integers(), min_size=1)), min_size=1
    )
)
def test_flatten_unflatten_round_trip(tree):
    assert unflatten(flatten(tree)) == tree


@given(st.text(max_size=12))
def test_unsafe_names_never_pass(name):
    import re

    ok = (
        bool(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}", name))
        and name
        not in (
            "c",
            "zarr.json",
        )
        and not name.endswith(".")
    )
    if ok:
        assert check_key_component(name) == name
    else:
        with pytest.raises(KeyNameError):
            check_key_component(name)


def test_layout_defaults_follow_row_size():
    img = KeyLayout.default(KeySpec("img", np.dtype("uint8"), (84, 84, 3)))
    assert img.chunk_rows == 1 and img.codec == "rowdiff" and 64 <= img.shard_rows <= 256
    st_ = KeyLayout.default(KeySpec("s", np.dtype("float32"), (64,)))
    assert st_.chunk_rows == 64 and st_.codec == "lz4" and st_.shard_rows % st_.chunk_rows == 0
    flag = KeyLayout.default(KeySpec("d", np.dtype("bool"), (4,)))
    assert flag.chunk_rows == 1024
    with pytest.raises(SchemaError, match="multiple"):
        img.with_overrides({"chunk_rows": 3, "shard_rows": 10})
    with pytest.raises(SchemaError, match="codec"):
        img.with_overrides({"codec": "brotli"})


def test_schema_json_round_trip():
    s = Schema.infer({"a": np.zeros((2, 3, 4), np.float32), "b/d": np.zeros((2, 3), bool)})
    assert Schema.from_json(s.to_json()) == s
    assert s.specs["b/d"].row_shape == ()
    with pytest.raises(SchemaError, match="\\[T, B, ...\\]"):
        Schema.infer({"a": np.zeros(3)})
