"""JSON text written by orjson reads back exactly as ``json`` wrote it (store/jsontext.py)."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from corral.server.store.jsontext import dumps

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(values)
def test_any_json_value_reads_back_the_same(value: Any) -> None:
    assert json.loads(dumps(value)) == json.loads(json.dumps(value))


def test_what_orjson_refuses_json_still_writes() -> None:
    huge = {"seed": 2**70, "also": -(2**65)}  # past 64 bits: orjson cannot write them
    assert json.loads(dumps(huge)) == huge
    assert json.loads(dumps({1: "a", 2.5: "b"})) == {"1": "a", "2.5": "b"}  # keys as json has them
    assert dumps({"a": [1, 2]}) == '{"a":[1,2]}'  # compact: what the store keeps


def test_nan_becomes_null() -> None:
    assert json.loads(dumps({"x": math.nan, "y": math.inf})) == {"x": None, "y": None}
