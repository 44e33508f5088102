"""Framework integrations, attached only when the profiled script imports the framework.

Importing a framework costs seconds (transformers: ~5-20 s here), so neither the launcher
nor the child imports one: :func:`install` puts a finder on ``sys.meta_path`` that waits
for the framework's own module to be executed by the script's import, then patches it
(:mod:`.hf`: ``transformers.Trainer.__init__`` attaches a ``PipelineDoctorCallback``;
:mod:`.lightning`: the same for ``lightning.pytorch`` or ``pytorch_lightning``'s Trainer;
:mod:`.lmdb`: ``lmdb``'s environments, transactions and cursors become counting proxies).
A script that never imports the framework pays one string comparison per import.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

# module whose execution defines the class to patch -> "package.module:function" that patches
# it and returns the undo
PATCHES: dict[str, str] = {
    "transformers.trainer": "probe.integrations.hf:patch_trainer_module",
    "lightning.pytorch": "probe.integrations.lightning:patch_lightning_package",
    "pytorch_lightning": "probe.integrations.lightning:patch_lightning_package",
    "lmdb": "probe.integrations.lmdb:patch_lmdb_module",
}


def _patcher(target: str) -> Callable[[ModuleType], Callable[[], None]]:
    module_name, function = target.split(":")
    return getattr(importlib.import_module(module_name), function)


class _PatchAfterExec(importlib.abc.Loader):
    def __init__(self, loader: Any, on_loaded: Callable[[ModuleType], None]):
        self._loader = loader
        self._on_loaded = on_loaded

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._on_loaded(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code: tracebacks, inspect
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, on_loaded: Callable[[str, ModuleType], None]):
        self._on_loaded = on_loaded
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in PATCHES or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchAfterExec(spec.loader, lambda m: self._on_loaded(fullname, m))
        return spec


class Integrations:
    """Patches each framework as the script loads it; :meth:`uninstall` undoes them."""

    def __init__(self, note: Callable[[str], None]):
        self._note = note
        self._undo: list[Callable[[], None]] = []
        self._finder = _Finder(self._patch)

    def install(self) -> None:
        for name in PATCHES:
            if name in sys.modules:  # imported before the session (an in-process caller)
                self._patch(name, sys.modules[name])
        sys.meta_path.insert(0, self._finder)

    def _patch(self, name: str, module: ModuleType) -> None:
        try:
            self._undo.append(_patcher(PATCHES[name])(module))
        except Exception as exc:  # an integration that breaks must not break the script
            self._note(f"integration for {name} not attached: {type(exc).__name__}: {exc}")

    def uninstall(self) -> None:
        if self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        while self._undo:
            self._undo.pop()()
