"""Optional dependencies of some tests: skipped locally when absent, but a hard failure in CI (CI=true), where
.ci/run installs them, so a broken install can never pass as 'skipped'. veRL is the exception: it pins
transformers < 5.11, so .ci/run installs it in its own venv (.venv-verl) and runs its test modules there with
VESPO_WITH_VERL=1, where a missing veRL fails; in the main venv they skip, naming that venv."""

import importlib
import os

import pytest

ELSEWHERE = {"verl": "VESPO_WITH_VERL"}
"""Top-level packages tested in a venv of their own -> the variable that makes them required there."""


def require(module: str):
    """Import `module`; skip the test module if it is missing, unless running in CI (or, for veRL, in its venv)."""
    top = module.partition(".")[0]
    required = os.environ.get(ELSEWHERE[top]) if top in ELSEWHERE else os.environ.get("CI")
    if required:
        return importlib.import_module(module)
    reason = f"{top} is not installed" + (
        " (veRL pins transformers < 5.11: bash .ci/install_verl.sh makes .venv-verl, where .ci/run tests it)"
        if top in ELSEWHERE
        else ""
    )
    return pytest.importorskip(module, reason=reason)
