"""Fails while its imports run: a dependency the environment lacks."""

import definitely_not_an_installed_module  # noqa: F401
