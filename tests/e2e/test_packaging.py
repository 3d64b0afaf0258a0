"""The package as a user installs it: a core of torch and numpy, extras for the rest, one version in one place, no
install warning from vespo's own metadata, and a command whose extra is missing says which one to install."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
HEAVY = ("transformers", "datasets", "math_verify", "matplotlib", "scipy", "tensorboard", "tyro", "yaml", "trl", "verl")


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower()


def test_core_needs_torch_and_numpy_only_and_every_extra_exists():
    project = PYPROJECT["project"]
    assert sorted(_name(r) for r in project["dependencies"]) == ["numpy", "torch"]
    extras = project["optional-dependencies"]
    needed = {"train", "rewards", "experiments", "models", "verl", "trl", "vllm", "all", "docs", "test"}
    assert needed <= set(extras), needed - set(extras)
    for extra, requirements in extras.items():  # a self-reference names only extras that exist
        for r in requirements:
            if _name(r) == "vespo":
                inner = set(re.search(r"\[(.*)\]", r).group(1).split(","))
                assert inner <= set(extras), (extra, inner - set(extras))


def test_no_install_warning_from_our_metadata():
    """Math-Verify's own antlr4 extra requests `latex2sympy2_extended[antlr4_9_3]`, which every install warns about:
    vespo names the runtime directly and requests no extra of math-verify."""
    requirements = [r for rs in PYPROJECT["project"]["optional-dependencies"].values() for r in rs]
    math_verify = [r for r in requirements if _name(r) == "math-verify"]
    assert math_verify and all("[" not in r for r in math_verify), math_verify
    assert any(_name(r) == "antlr4-python3-runtime" for r in requirements)


def test_one_version_in_one_place_shown_by_the_command():
    import vespo

    assert PYPROJECT["project"]["dynamic"] == ["version"] and "version" not in PYPROJECT["project"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "vespo.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", vespo.__version__)
    assert f"## {vespo.__version__}" in (ROOT / "CHANGELOG.md").read_text()  # the release has its changelog entry
    done = subprocess.run([sys.executable, "-m", "vespo", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == f"vespo {vespo.__version__}"
    assert "Apache License" in (ROOT / "LICENSE").read_text() and PYPROJECT["project"]["license"] == "Apache-2.0"


def test_the_core_imports_none_of_the_extras():
    """The loss library, kernels, diagnostics and the README's loss call import nothing beyond torch and numpy."""
    code = (
        "import sys, torch, vespo, vespo.losses, vespo.kernels, vespo.diagnostics, vespo.aggregation, "
        "vespo.advantages, vespo.step_control\n"
        "lp = -torch.rand(2, 3)\n"
        "vespo.compute_policy_loss('vespo', log_prob=lp, old_log_prob=lp, advantages=torch.ones(2), "
        "response_mask=torch.ones(2, 3))\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


@pytest.mark.slow
@pytest.mark.parametrize(("command", "extra"), [("train", "train"), ("sweep", "experiments")])
def test_a_command_without_its_extra_names_the_extra_in_one_line(command, extra):
    """As in a core install: the command's module cannot import a package of its extra (blocked here)."""
    code = (
        "import sys\n"
        "for m in ('yaml', 'tyro', 'transformers', 'datasets'):\n"
        "    sys.modules[m] = None  # import fails as if not installed\n"
        "from vespo.cli import main\n"
        f"sys.exit(main([{command!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"vespo {command}: needs ") and line.endswith(f"pip install 'vespo[{extra}]'"), line


@pytest.mark.parametrize(("module", "engine"), [("trl", "trl"), ("verl", "verl")])
def test_an_integration_without_its_engine_fails_in_one_line(module, engine):
    code = f"import sys\nsys.modules[{engine!r}] = None\nimport vespo.integrations.{module}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ModuleNotFoundError: vespo.integrations.{module} needs "), last
    assert ("pip install 'vespo[trl]'" if module == "trl" else "bash .ci/install_verl.sh") in last
