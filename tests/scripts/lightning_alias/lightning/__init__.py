"""``lightning`` for a machine where only ``pytorch_lightning`` is installed (the tests here:
``lightning`` itself does not install).

The unified ``lightning`` package ships the same code as the standalone
``pytorch_lightning`` and ``lightning_fabric``, under ``lightning.pytorch`` and
``lightning.fabric``: the standalone packages are generated from it with the imports renamed
(pytorch_lightning 2.6.6's ``demos/transformer.py`` is Lightning 2.6.5's
``src/lightning/pytorch/demos/transformer.py`` with ``lightning.pytorch`` read as
``pytorch_lightning``). So each ``lightning.pytorch.X`` here *is* ``pytorch_lightning.X``,
the same module object, and the names below are those of Lightning's own
``lightning/__init__.py``. Only tests put this folder on ``PYTHONPATH``, for the vendored
Lightning example that imports ``lightning`` (tests/probe/test_third_party_lightning.py).
"""

import importlib
import importlib.abc
import importlib.util
import sys

_ALIASES = {"lightning.pytorch": "pytorch_lightning", "lightning.fabric": "lightning_fabric"}


def _real_name(name: str) -> str | None:
    for alias, real in _ALIASES.items():
        if name == alias or name.startswith(alias + "."):
            return real + name[len(alias) :]
    return None


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self) -> None:
        self._specs: dict[str, object] = {}

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if _real_name(name) else None

    def create_module(self, spec):
        module = importlib.import_module(_real_name(spec.name))
        self._specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module):
        # the import system gave the module our spec: it keeps its own
        module.__spec__ = self._specs.get(module.__name__, module.__spec__)


sys.meta_path.insert(0, _Alias())

from lightning.fabric.fabric import Fabric  # noqa: E402
from lightning.fabric.utilities.seed import seed_everything  # noqa: E402
from lightning.pytorch import __version__  # noqa: E402
from lightning.pytorch.callbacks import Callback  # noqa: E402
from lightning.pytorch.core import LightningDataModule, LightningModule  # noqa: E402
from lightning.pytorch.trainer import Trainer  # noqa: E402

__all__ = [
    "Trainer",
    "LightningDataModule",
    "LightningModule",
    "Callback",
    "seed_everything",
    "Fabric",
    "__version__",
]
