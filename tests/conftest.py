"""Shared fixtures and the test tiers.

Tiers: `@pytest.mark.slow` marks tests that take over ~5 s on a quiet 2-core box (20 s or more on a loaded one).
`python -m pytest -n 2 -m "not slow" tests` is the everyday command (the README's); CI runs every tier on two workers
(`.ci/run`: `-n 2 --dist loadfile`, so a file's module fixtures are built once).
"""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _support import warm_tiny_model


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: over ~5 s on a quiet 2-core box; deselect with -m 'not slow'")


@pytest.fixture(scope="session")
def warm_model(tmp_path_factory) -> SimpleNamespace:
    """The tiny model briefly warm-started once per session (`_support.warm_tiny_model`, on one thread, as the pinned
    metrics of tests/train/test_train_layout.py were taken): `.model` (its directory: read it, never write into it),
    `.train` and `.heldout` (the arithmetic task's split)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, train, heldout = warm_tiny_model(tmp_path_factory.mktemp("warm_model"))
    finally:
        torch.set_num_threads(threads)
    return SimpleNamespace(model=Path(model), train=train, heldout=heldout)


@pytest.fixture(scope="session")
def random_model(tmp_path_factory) -> Path:
    """A random (untrained) one-layer tiny Llama with the embedded task's tokenizer, saved once per session: for tests
    of what a command does, not of what it learns (read it, never write into it)."""
    from vespo.embedded.task import build_tiny_model, build_tokenizer

    path = tmp_path_factory.mktemp("random_model") / "m"
    tok = build_tokenizer()
    build_tiny_model(tok, num_hidden_layers=1).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def with_model(root: Path, warm: SimpleNamespace) -> Path:
    """`root` with `root/model` linking to the shared warm model, for tests that address files relative to a root."""
    (root / "model").symlink_to(warm.model, target_is_directory=True)
    return root
