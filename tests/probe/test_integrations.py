"""Framework integrations cost nothing to a script that does not use the framework:
transformers is imported only by the script's own import, and only then is Trainer patched.

Each case runs in a fresh interpreter (``sys.modules`` empty of transformers); no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.probe.helpers import child_env

WATCH = """
import sys

import pytest
from probe.integrations import Integrations
notes = []
integrations = Integrations(notes.append)
integrations.install()
"""


def _python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def test_watching_for_transformers_imports_nothing_and_undoes_cleanly():
    out = _python(
        WATCH
        + "import json, email.parser\n"
        + "integrations.uninstall()\n"
        + "print('transformers' in sys.modules, any('probe.integrations' in repr(f) "
        + "for f in sys.meta_path), notes)"
    )
    assert out == "False False []"


def test_the_launcher_imports_neither_transformers_nor_torch():
    out = _python(
        "import sys, probe.cli; print('transformers' in sys.modules, 'torch' in sys.modules)"
    )
    assert out == "False False"


@pytest.mark.slow
def test_the_scripts_own_import_of_trainer_patches_it_and_uninstall_restores_it():
    out = _python(
        WATCH
        + "from transformers import Trainer\n"  # the lazy module's path, as scripts import it
        + "patched = hasattr(Trainer.__init__, '__wrapped__')\n"  # functools.wraps' mark
        + "integrations.uninstall()\n"
        + "print(patched, hasattr(Trainer.__init__, '__wrapped__'), notes)"
    )
    assert out == "True False []"
