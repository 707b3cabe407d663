"""runtime/schema_finite.py: llama.cpp's bounds added where a schema gives none, never over the
schema's own (pure function; the engine's reading of them is in test_grammar_llg.py)."""

from __future__ import annotations

from llamaspec.runtime.schema_finite import FORMAT_MAX_LENGTH, FRACTION_STEP, INT_LIMIT, finite


def test_unbounded_numbers_get_sixteen_digits_and_ten_decimals():
    assert finite({"type": "integer"}) == {"type": "integer", "minimum": -INT_LIMIT, "maximum": INT_LIMIT}
    assert finite({"type": ["number", "null"]})["multipleOf"] == FRACTION_STEP
    assert "multipleOf" not in finite({"type": "integer"})


def test_the_schemas_own_bounds_are_kept():
    assert finite({"type": "integer", "minimum": 3}) == {"type": "integer", "minimum": 3, "maximum": INT_LIMIT}
    assert finite({"type": "integer", "exclusiveMaximum": 0})["minimum"] == -INT_LIMIT
    assert "maximum" not in finite({"type": "integer", "exclusiveMaximum": 0})
    above = finite({"type": "integer", "minimum": 10**18})          # our maximum would empty it
    assert "maximum" not in above
    assert finite({"type": "number", "multipleOf": 0.25})["multipleOf"] == 0.25
    # a bound finer than 10 decimals would not be a multiple of the step: no step then
    assert "multipleOf" not in finite({"type": "number", "minimum": 1e-12})
    assert finite({"enum": [1, 2]}) == {"enum": [1, 2]} and finite({"type": "integer", "const": 7}) == {"type": "integer", "const": 7}
    assert finite({"type": "string", "format": "time", "maxLength": 8})["maxLength"] == 8
    assert finite({"type": "string", "format": "email", "pattern": "x"})["pattern"] == "x"


def test_every_subschema_is_reached_and_the_input_is_not_changed():
    schema = {"type": "object", "properties": {"a": {"type": "number"}},
              "$defs": {"t": {"type": "string", "format": "time"}},
              "additionalProperties": {"type": "integer"},
              "anyOf": [{"type": "array", "items": {"type": "string", "format": "uri"}, "prefixItems": [{"type": "integer"}]}]}
    out = finite(schema)
    assert out["properties"]["a"]["maximum"] == INT_LIMIT
    assert out["$defs"]["t"]["maxLength"] == FORMAT_MAX_LENGTH["time"]
    assert out["additionalProperties"]["minimum"] == -INT_LIMIT
    assert out["anyOf"][0]["items"]["maxLength"] == FORMAT_MAX_LENGTH["uri"]
    assert out["anyOf"][0]["prefixItems"][0]["maximum"] == INT_LIMIT
    assert "maximum" not in schema["properties"]["a"] and "maxLength" not in schema["$defs"]["t"]
