"""The documentation site: generated pages are current, `mkdocs build --strict` passes, every public name has a
rendered API entry, every Python block of the Getting-started page runs, and no table cell runs past two sentences."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"

# module -> the source file whose `__all__` lists its public names (read statically: TRL and veRL need not be here)
PUBLIC = {
    "vespo.losses": "src/vespo/losses/__init__.py",
    "vespo.rewards": "src/vespo/rewards/__init__.py",
    "vespo.integrations.trl": "src/vespo/integrations/trl.py",
    "vespo.integrations.verl": "src/vespo/integrations/verl.py",
}
# modules without `__all__`: every top-level function and class not starting with "_"
PUBLIC_DEFS = ["vespo.kernels", "vespo.diagnostics", "vespo.aggregation", "vespo.advantages", "vespo.step_control"]


def _all_of(path: Path) -> list[str]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{path} has no __all__")


def _defs_of(module: str) -> list[str]:
    tree = ast.parse((ROOT / "src" / (module.replace(".", "/") + ".py")).read_text())
    kinds = (ast.FunctionDef, ast.ClassDef)
    return [n.name for n in tree.body if isinstance(n, kinds) and not n.name.startswith("_")]


def _lazy_of_vespo() -> dict[str, str]:
    """`vespo`'s PEP 562 names -> the module each loads from (`vespo._LAZY`, read without importing torch)."""
    import vespo

    return dict(vespo._LAZY)


def test_generated_pages_are_current():
    done = subprocess.run([sys.executable, str(DOCS / "gen_results.py"), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_no_table_cell_runs_past_two_sentences():
    def sentences(cell: str) -> int:
        text = re.sub(r"`[^`]*`", "X", cell)
        text = re.sub(r"\b(e\.g|i\.e|vs|et al|Eq|Sec|Prop|App|Fig|cf|No)\.", "X", text)
        text = re.sub(r"\d\.\d", "X", text)
        return len([s for s in re.split(r"[.!?](?:\s|$)", text) if s.strip()])

    long = []
    for page in sorted(DOCS.rglob("*.md")):
        for i, line in enumerate(page.read_text().splitlines(), 1):
            if line.startswith("|") and not re.fullmatch(r"\|[-| :]+\|", line.strip()):
                cells = line.strip().strip("|").split(" | ")
                long += [f"{page.relative_to(ROOT)}:{i}: {c[:80]}" for c in cells if sentences(c) > 2]
    assert not long, "\n".join(long)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return out


@pytest.mark.slow
def test_site_builds_strict_and_every_public_name_has_an_api_entry(site):
    html = "\n".join(p.read_text() for p in (site / "reference").rglob("*.html"))
    anchors = set(re.findall(r'id="(vespo[\w.]*)"', html))
    expected = {f"{m}.{name}" for m, src in PUBLIC.items() for name in _all_of(ROOT / src)}
    expected |= {f"{m}.{name}" for m in PUBLIC_DEFS for name in _defs_of(m)}
    expected |= {f"{module}.{name}" for name, module in _lazy_of_vespo().items() if name != "kernels"}
    expected |= {"vespo.train.config.TrainConfig", "vespo.__version__"}
    missing = sorted(expected - anchors)
    assert not missing, f"no rendered API entry for {missing}"
    assert (site / "results" / "index.html").is_file() and (site / "getting-started" / "index.html").is_file()


def _getting_started_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / "getting-started.md").read_text(), re.S)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(_getting_started_blocks())))
def test_getting_started_python_blocks_run_as_written(index, tmp_path, monkeypatch):
    code = _getting_started_blocks()[index]
    if "vespo.integrations.trl" in code:
        pytest.importorskip("trl")
    monkeypatch.chdir(tmp_path)  # files a block writes ("tiny", "out") land here
    exec(compile(code, f"getting-started.md block {index}", "exec"), {})  # noqa: S102 - this repository's own text
