"""The README's snippets work verbatim (issue 22): the TRL quick start runs on CPU, on a local tiny model in place
of the Hub id (the Hub is not reachable in CI), and its extras are installable names of this package."""

import re
from pathlib import Path

import pytest

README = (Path(__file__).parents[1] / "README.md").read_text()


def test_trl_snippet_runs_verbatim_on_cpu(tmp_path, monkeypatch):
    pytest.importorskip("trl")
    from vespo.embedded.task import build_tiny_model, build_tokenizer

    block = re.search(r"With TRL .*?```python\n(.*?)```", README, re.S)
    assert block is not None, "the README lost its TRL snippet"
    code = block.group(1)
    assert "use_cpu=True" in code and 'model="Qwen/Qwen3-0.6B"' in code
    tok = build_tokenizer()
    build_tiny_model(tok, num_hidden_layers=1).save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    monkeypatch.chdir(tmp_path)  # output_dir="out" lands here
    code = code.replace('"Qwen/Qwen3-0.6B"', repr(str(tmp_path / "tiny"))).replace("max_steps=16", "max_steps=2")
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the snippet is this repository's own text
    history = scope["trainer"].state.log_history
    assert any("train_loss" in h for h in history)
    assert any(k in h for h in history for k in ("vespo/Z", "weight/ess", "is/ess"))  # vespo's own metrics


def test_readme_extras_exist_and_install_from_the_clone():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    named = set(re.findall(r'pip install -e "\.\[(\w+)\]"', README)) | set(re.findall(r"\.\[(\w+)\]", README))
    assert named and named <= set(extras), named - set(extras)
    assert 'pip install "vespo[' not in README  # not on PyPI: the extras install from the clone
