"""Optional dependencies of some tests: skipped locally when absent, but a hard failure in CI (CI=true), where
.ci/run installs them, so a broken install can never pass as 'skipped'."""

import importlib
import os

import pytest


def require(module: str):
    """Import `module`; skip the test module if it is missing, unless running in CI."""
    if os.environ.get("CI"):
        return importlib.import_module(module)
    return pytest.importorskip(module)
