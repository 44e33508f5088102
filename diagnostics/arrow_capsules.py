"""Columns made by this project's compiled modules, handed to polars without a copy."""

from __future__ import annotations

import polars as pl


class ArrowColumn:
    """One column's (schema, array) capsules from a compiled module, as polars takes them
    (the Arrow PyCapsule interface): the column moves into a Series without a copy."""

    __slots__ = ("capsules",)

    def __init__(self, capsules: tuple[object, object]):
        self.capsules = capsules

    def __arrow_c_array__(self, requested_schema: object | None = None) -> tuple[object, object]:
        return self.capsules


def series(capsules: tuple[object, object]) -> pl.Series:
    """The column as a Series, named as its schema names it."""
    return pl.Series(ArrowColumn(capsules))
