"""Dotted config keys (``"data.num_workers"``): one lookup and one flattening for every reader.

A run stores its config nested (``{"data": {"num_workers": 0}}``) while patches, ``--set``,
the docs and the pages name a setting by its dotted key; uploads and older files may hold the
dotted keys flat. The trainer, the views, the comparison, the pricing and the rules all read
settings through these two functions, so they agree on both shapes.

No polars here: the trainer's config module imports this before any usage error is reported.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def dotted_get(config: Mapping[str, Any] | None, key: str, default: Any = None) -> Any:
    """The value of ``key`` from a flat dotted config or a nested one; ``default`` when absent."""
    if not config:
        return default
    if key in config:
        return config[key]
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def flatten_dotted(
    config: Mapping[str, Any] | None,
    *,
    descend: Callable[[str], bool] | None = None,
    prefix: str = "",
) -> dict[str, Any]:
    """``{"data": {"num_workers": 0}}`` -> ``{"data.num_workers": 0}``; dotted keys pass through.

    ``descend(dotted_key)`` says whether a mapping value is a section to open; by default
    every mapping is, and with it a mapping-valued setting stays one value.
    """
    flat: dict[str, Any] = {}
    for key, value in (config or {}).items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and (descend is None or descend(dotted)):
            flat.update(flatten_dotted(value, descend=descend, prefix=f"{dotted}."))
        else:
            flat[dotted] = value
    return flat
