"""Reading a YAML document field by field, each value with the line it is on.

A document is composed (``yaml.compose``) rather than loaded, so that every
value keeps its position: a mistake is reported as ``field: line N: what``.
``Fields`` reads one mapping's keys one at a time and refuses, at ``done``,
any key nobody read (a misspelt field is an error, not silently ignored).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import yaml

from corral.core.errors import InvalidSpec

MAX_ENTRIES = 10_000
"""Items one list or table may hold: bounded work for whoever reads the document."""

T = TypeVar("T")


class Fields:
    """A YAML mapping whose keys are read one by one; ``done`` refuses the unread ones.
    ``where`` is its path in the document ("" at the top), which errors name."""

    def __init__(self, node: yaml.Node, where: str) -> None:
        self.where = where
        self.line = node.start_mark.line + 1
        if not isinstance(node, yaml.MappingNode):
            raise InvalidSpec(where or "document", f"line {self.line}: must be a mapping")
        self.items: dict[str, yaml.Node] = {}
        self.keys_at: dict[str, int] = {}
        for key, value in node.value:
            name = str(key.value)
            if name in self.items:
                raise InvalidSpec(join_path(where, name), f"line {line_of(key)}: given twice")
            self.items[name] = value
            self.keys_at[name] = line_of(key)
        self._read: set[str] = set()

    def names(self) -> list[str]:
        self._read.update(self.items)
        return list(self.items)

    def error(self, key: str, message: str) -> InvalidSpec:
        node = self.items.get(key)
        line = line_of(node) if node is not None else self.line
        return InvalidSpec(join_path(self.where, key), f"line {line}: {message}")

    def req(self, key: str, read: Callable[[yaml.Node, str], T]) -> T:
        if key not in self.items:
            raise InvalidSpec(join_path(self.where, key), f"line {self.line}: missing")
        value = self.opt(key, read)
        if value is None:
            raise self.error(key, "must be given")
        return value

    def opt(self, key: str, read: Callable[[yaml.Node, str], T]) -> T | None:
        self._read.add(key)
        node = self.items.get(key)
        if node is None or is_null(node):
            return None
        return read(node, join_path(self.where, key))

    def is_null(self, key: str) -> bool:
        node = self.items.get(key)
        return node is not None and is_null(node)

    def sub(self, key: str) -> Fields | None:
        self._read.add(key)
        node = self.items.get(key)
        return None if node is None or is_null(node) else Fields(node, join_path(self.where, key))

    def entries(self, key: str) -> list[tuple[str, Fields]]:
        """A mapping of names to mappings (``users``, ``teams``, ``pools``)."""
        table = self.sub(key)
        if table is None:
            return []
        names = table.names()
        if len(names) > MAX_ENTRIES:
            raise self.error(key, f"at most {MAX_ENTRIES} entries")
        out = []
        for name in names:
            if not 1 <= len(name) <= 128:
                raise table.error(name, "a name of 1 to 128 characters")
            out.append((name, Fields(table.items[name], join_path(table.where, name))))
        return out

    def done(self) -> None:
        unknown = [k for k in self.items if k not in self._read]
        if unknown:
            key = unknown[0]
            known = ", ".join(sorted(self._read)) or "none"
            raise InvalidSpec(
                join_path(self.where, key),
                f"line {self.keys_at[key]}: unknown field (known here: {known})",
            )


def join_path(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def line_of(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"


def scalar(node: yaml.Node, where: str) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        raise InvalidSpec(where, f"line {line_of(node)}: must be a single value")
    return yaml.constructor.SafeConstructor().construct_object(node)


def seq(node: yaml.Node, where: str) -> list[yaml.Node]:
    if not isinstance(node, yaml.SequenceNode):
        raise InvalidSpec(where, f"line {line_of(node)}: must be a list")
    if len(node.value) > MAX_ENTRIES:
        raise InvalidSpec(where, f"line {line_of(node)}: at most {MAX_ENTRIES} entries")
    return list(node.value)


def integer(node: yaml.Node, where: str) -> int:
    value = scalar(node, where)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSpec(where, f"line {line_of(node)}: must be a whole number, not {value!r}")
    return value


def count(node: yaml.Node, where: str) -> int:
    value = integer(node, where)
    if value < 0:
        raise InvalidSpec(where, f"line {line_of(node)}: must be >= 0")
    return value


def positive_int(node: yaml.Node, where: str) -> int:
    value = integer(node, where)
    if value < 1:
        raise InvalidSpec(where, f"line {line_of(node)}: must be >= 1 (null: off)")
    return value


def number(node: yaml.Node, where: str) -> float:
    value = scalar(node, where)
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise InvalidSpec(where, f"line {line_of(node)}: must be a number, not {value!r}")
    return float(value)


def seconds(node: yaml.Node, where: str) -> float:
    value = number(node, where)
    if value < 0:
        raise InvalidSpec(where, f"line {line_of(node)}: must be >= 0 seconds")
    return value


def boolean(node: yaml.Node, where: str) -> bool:
    value = scalar(node, where)
    if not isinstance(value, bool):
        raise InvalidSpec(where, f"line {line_of(node)}: must be true or false, not {value!r}")
    return value


def a_name(node: yaml.Node, where: str) -> str:
    value = scalar(node, where)
    if not isinstance(value, str) or not 1 <= len(value) <= 128:
        raise InvalidSpec(where, f"line {line_of(node)}: must be a name of 1 to 128 characters")
    return value


def name_list(node: yaml.Node, where: str) -> frozenset[str]:
    return frozenset(a_name(item, f"{where}[{i}]") for i, item in enumerate(seq(node, where)))


def default(value: T | None, fallback: T) -> T:
    return fallback if value is None else value
