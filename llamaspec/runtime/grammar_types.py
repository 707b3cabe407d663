"""A JSON schema rewritten so llama-cpp-python's converter enforces all of it: a `type` list
with other keywords becomes an `anyOf` of one branch per type carrying the keywords of that type,
and `enum` / `const` keep only the values of the schema's type(s). The converter reads a `type`
list before `enum`, `const`, `properties`, `pattern`, `items`, ... and silently dropped them
(`{"type": ["string", "null"], "enum": ["red", "green"]}` allowed any string).

    >>> split_types({"type": ["string", "null"], "enum": ["red", None, 3]})["anyOf"]
    [{'type': 'string', 'enum': ['red']}, {'type': 'null', 'enum': [None]}]
    >>> split_types({"type": "string", "enum": ["a", 1]})
    {'type': 'string', 'enum': ['a']}

The rewritten node keeps its other keys (the converter reads `anyOf` first), so a `$ref` into it
(`#/$defs/X/properties/y`) still resolves, to the rewritten child.
"""

from __future__ import annotations

from typing import Any

_OWN = {
    "string": ("pattern", "format", "minLength", "maxLength"),
    "object": ("properties", "required", "additionalProperties", "allOf"),
    "array": ("items", "prefixItems", "minItems", "maxItems"),
}
_TYPED = {k for keys in _OWN.values() for k in keys}
_MAPS = ("properties", "$defs", "definitions")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_ONE = ("items", "additionalProperties")


class Unsatisfiable(ValueError):
    """No value of the schema's type(s) is one of its enum / its const."""


def of_type(v: Any, t: str) -> bool:
    """Whether JSON value `v` is of JSON schema type `t`."""
    if t == "null":
        return v is None
    if t == "boolean":
        return isinstance(v, bool)
    if t == "integer":
        return not isinstance(v, bool) and (isinstance(v, int) or (isinstance(v, float) and v.is_integer()))
    if t == "number":
        return not isinstance(v, bool) and isinstance(v, (int, float))
    if t == "string":
        return isinstance(v, str)
    if t == "array":
        return isinstance(v, list)
    if t == "object":
        return isinstance(v, dict)
    return True


def _branch(node: dict, t: str, where: str) -> dict | None:
    """The part of `node` for type `t`; None when its enum / const leave no value of that type."""
    out: dict[str, Any] = {"type": t}
    for key in _OWN.get(t, ()):
        if key in node:
            out[key] = node[key]
    if isinstance(node.get("enum"), list):
        values = [v for v in node["enum"] if of_type(v, t)]
        if not values:
            return None
        out["enum"] = values
    if "const" in node:
        if not of_type(node["const"], t):
            return None
        out["const"] = node["const"]
    return out


def split_types(node: Any, where: str = "schema") -> Any:
    """The schema with every type list split and every enum / const filtered by type (a new
    object; the input is not changed). Raises Unsatisfiable naming where."""
    if isinstance(node, list):
        return [split_types(x, f"{where}[{i}]") for i, x in enumerate(node)]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in _MAPS and isinstance(value, dict):
            out[key] = {k: split_types(v, f"{where}.{key}.{k}") for k, v in value.items()}
        elif key in _LISTS and isinstance(value, list) or key in _ONE and isinstance(value, (dict, list)):
            out[key] = split_types(value, f"{where}.{key}")
        else:
            out[key] = value
    t = out.get("type")
    if "$ref" in out or "anyOf" in out or "oneOf" in out:   # (the converter reads these before the type)
        return out
    if isinstance(t, str) and ("enum" in out or "const" in out):
        branch = _branch(out, t, where)
        if branch is None:
            raise Unsatisfiable(f"no value of type {t} is {'one of its enum' if 'enum' in out else 'its const'} "
                                f"(at {where})")
        return {**out, **branch}
    if not isinstance(t, list) or not all(isinstance(x, str) for x in t):
        return out
    types = list(dict.fromkeys(t))
    if "integer" in types and "number" in types:
        types.remove("integer")
    branches = [b for b in (_branch(out, x, where) for x in types) if b is not None]
    if not branches:
        raise Unsatisfiable(f"no value of the types {', '.join(types) or '(none)'} matches its enum or const "
                            f"(at {where})")
    if len(branches) == 1:
        rest = {k: v for k, v in out.items() if k not in _TYPED and k not in ("type", "enum", "const")}
        return {**rest, **branches[0]}
    return {**out, "anyOf": branches}
