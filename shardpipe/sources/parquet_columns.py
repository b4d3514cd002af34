"""Which columns of a Parquet dataset become fields, and how: one :class:`ColumnRule` per kept column.

The rules are decided from the schema alone, before any row is read: a column's Arrow type gives its
kind (:func:`column_kind`), the user's mapping its field name, and a column no field can hold is an
:class:`UnusableColumnError` naming it. :mod:`shardpipe.sources.parquet_table` lists the kinds and the
default names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardpipe.errors import UsageError


class UnusableColumnError(UsageError):
    """A column whose type cannot become a field; ``column`` names it (leaving it out is the fix), and
    ``problem`` is the message without the fix (the CLI gives the flag instead)."""

    def __init__(self, message: str, *, column: str = "", problem: str = "") -> None:
        super().__init__(message)
        self.column, self.problem = column, problem or message

    @classmethod
    def of(cls, problem: str, column: str) -> UnusableColumnError:
        message = f"{problem}; leave it out with field_map={{{column!r}: ''}}"
        return cls(message, column=column, problem=problem)


@dataclass(frozen=True, slots=True)
class ColumnRule:
    """How one column becomes a field."""

    column: str
    kind: str
    """``bytes``, ``text``, ``integer``, ``value`` (other scalars), ``blob`` ({bytes, path}) or ``array``."""
    field: str | None
    """The field's name; None for a blob named row by row by its path (or its bytes' signature)."""
    dtype: str = ""
    """An array's numpy dtype."""


def column_rules(
    schema: Any, shown: str, field_map: Mapping[str, str], key_column: str | None
) -> tuple[ColumnRule, ...]:
    """Each kept column's rule, checked: every column usable, names valid and distinct, the mapping and
    the key column naming columns that exist."""
    names = list(schema.names)
    unknown = sorted(set(field_map) - set(names))
    if unknown:
        raise UsageError(
            f"the field mapping names {', '.join(map(repr, unknown))}, not columns of {shown} "
            f"(columns: {', '.join(names)})"
        )
    if key_column is not None:
        _check_key_column(schema, shown, key_column)
    rules: list[ColumnRule] = []
    for name in names:
        if name == key_column or field_map.get(name) == "":
            continue
        arrow_type = schema.field(name).type
        kind, dtype = column_kind(arrow_type)
        if kind is None:
            raise UnusableColumnError.of(
                f"column {name!r} of {shown} is {arrow_type}, which cannot become a field (binary, string, "
                "number, boolean, a list of numbers or a {bytes, path} struct can)",
                name,
            )
        default = f"{name}.npy" if kind == "array" else None if kind == "blob" else name
        rules.append(ColumnRule(column=name, kind=kind, field=field_map.get(name, default), dtype=dtype))
    for rule in rules:
        if rule.field is not None:
            _check_field_name(rule.field, rule.column)
    named = [rule.field for rule in rules if rule.field is not None]
    twice = sorted({name for name in named if named.count(name) > 1})
    if twice:
        raise UsageError(f"several columns of {shown} map to the field {twice[0]!r}; give each its own name")
    if not rules:
        raise UsageError(f"no column of {shown} is left to become a field")
    return tuple(rules)


def _check_key_column(schema: Any, shown: str, key_column: str) -> None:
    names = list(schema.names)
    if key_column not in names:
        raise UsageError(
            f"key column {key_column!r} is not a column of {shown} (columns: {', '.join(names)})"
        )
    kind, _ = column_kind(schema.field(key_column).type)
    if kind not in ("text", "integer"):
        raise UsageError(
            f"key column {key_column!r} of {shown} is {schema.field(key_column).type}; a key column "
            "holds strings or integers"
        )


def _check_field_name(name: str, column: str) -> None:
    if not name or "/" in name or "\0" in name or name.startswith("__"):
        raise UsageError(
            f"column {column!r} would become field {name!r}, but a field name must be non-empty, hold no "
            f"'/' and not start with '__'; name it with the field mapping {column}=NAME, or leave it out "
            f"with {column}="
        )


def column_kind(arrow_type: Any) -> tuple[str | None, str]:
    """``(kind, numpy dtype of an array)`` of a column type; ``(None, "")`` when no field can hold it."""
    import pyarrow.types as t

    if t.is_dictionary(arrow_type):  # a pandas categorical, say: its values decide
        return column_kind(arrow_type.value_type)
    if t.is_binary(arrow_type) or t.is_large_binary(arrow_type) or t.is_fixed_size_binary(arrow_type):
        return "bytes", ""
    if t.is_string(arrow_type) or t.is_large_string(arrow_type):
        return "text", ""
    if t.is_integer(arrow_type):
        return "integer", ""
    if (
        t.is_boolean(arrow_type)
        or t.is_floating(arrow_type)
        or t.is_decimal(arrow_type)
        or t.is_temporal(arrow_type)
    ):
        return "value", ""
    if t.is_struct(arrow_type):
        return ("blob" if _is_blob(arrow_type) else None), ""
    leaf = arrow_type
    while t.is_list(leaf) or t.is_large_list(leaf) or t.is_fixed_size_list(leaf):
        leaf = leaf.value_type
    if leaf is not arrow_type and (t.is_integer(leaf) or t.is_floating(leaf) or t.is_boolean(leaf)):
        return "array", str(np.dtype(leaf.to_pandas_dtype()))
    return None, ""


def _is_blob(arrow_type: Any) -> bool:
    """Whether a struct type is exactly ``{bytes: binary, path: string}`` (Hugging Face's Image, Audio)."""
    import pyarrow.types as t

    members = {arrow_type.field(i).name: arrow_type.field(i).type for i in range(arrow_type.num_fields)}
    binary, path = members.get("bytes"), members.get("path")
    return (
        set(members) == {"bytes", "path"}
        and (t.is_binary(binary) or t.is_large_binary(binary))
        and (t.is_string(path) or t.is_large_string(path))
    )
