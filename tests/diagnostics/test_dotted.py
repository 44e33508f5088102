"""Dotted config keys: one lookup and one flattening, for flat and nested configs alike."""

from __future__ import annotations

import ast
from pathlib import Path

from diagnostics.dotted import dotted_get, flatten_dotted

REPO = Path(__file__).resolve().parents[2]
NESTED = {"scenario": "healthy", "data": {"num_workers": 0, "pin_memory": False}, "train": {}}


def test_get_reads_nested_and_flat_keys_and_falls_back_to_the_default():
    assert dotted_get(NESTED, "data.num_workers") == 0
    assert dotted_get({"data.num_workers": 4}, "data.num_workers") == 4
    assert dotted_get(NESTED, "data.pin_memory", True) is False
    assert dotted_get(NESTED, "data.missing", "d") == "d"
    assert dotted_get(NESTED, "scenario.name") is None  # a value is not a section
    assert dotted_get(None, "data.num_workers", 7) == 7
    assert dotted_get({}, "x") is None


def test_flatten_opens_every_mapping_or_only_the_sections_asked_for():
    assert flatten_dotted(NESTED) == {
        "scenario": "healthy",
        "data.num_workers": 0,
        "data.pin_memory": False,
    }
    nested_value = {"data": {"weights": {"a": 1}}}
    assert flatten_dotted(nested_value, descend={"data"}.__contains__) == {"data.weights": {"a": 1}}
    assert flatten_dotted({"data.num_workers": 2}) == {"data.num_workers": 2}
    assert flatten_dotted(None) == {}


def _recurses_on_mappings(func: ast.FunctionDef) -> bool:
    calls_itself = any(
        isinstance(n, ast.Call) and getattr(n.func, "id", None) == func.name for n in ast.walk(func)
    )
    # f"{dotted}." : the prefix of the next level's dotted keys
    builds_dotted_prefix = any(
        isinstance(n, ast.JoinedStr)
        and isinstance(n.values[-1], ast.Constant)
        and n.values[-1].value == "."
        for n in ast.walk(func)
    )
    return calls_itself and builds_dotted_prefix


def test_no_module_walks_dotted_keys_by_hand():
    """The copies in the trainer, views, compare, pricing and rules stay gone."""
    found = []
    roots = [REPO / "trainer", REPO / "diagnostics", REPO / "app_ui", REPO / "pages"]
    for path in (p for root in roots for p in root.rglob("*.py")):
        if path.name == "dotted.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            # a function that recurses over a config's mappings re-implements flatten_dotted
            if isinstance(node, ast.FunctionDef) and _recurses_on_mappings(node):
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
    assert found == []
