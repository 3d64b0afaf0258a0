"""The house's shape (docs/architecture.md): rooms in layers whose imports point down only, the dispatcher on top,
no module over 500 lines and no function over 60, so each room and each step reads in one sitting."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).parents[2] / "src" / "vespo"

LAYERS = [
    ("base", {"intervals", "deadline", "outputs", "argv", "kernels", "aggregation"}),
    ("pure core", {"losses", "advantages", "diagnostics", "step_control"}),
    ("data", {"data", "sandbox", "checkpoints", "plots"}),
    ("grading and models", {"rewards", "models", "machine"}),
    ("generation", {"rollout", "embedded"}),
    ("evaluation", {"evaluation"}),
    ("trainer", {"train"}),
    ("harness and engines", {"experiments", "integrations"}),
    ("command line", {"cli", "__main__"}),
]
"""Low to high: a module imports only from its own layer and those below it."""

ROOM_LAYER = {room: i for i, (_, rooms) in enumerate(LAYERS) for room in rooms}


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__"): p
            for p in SRC.rglob("*.py")}  # fmt: skip


def _room(module: str) -> str | None:
    """The top-level room of `vespo.<room>[...]`; None for the package itself (its lazy public face)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _imported(path: Path, modules: dict[str, Path]) -> set[str]:
    """The vespo modules `path` imports, anywhere in it (a function-level import is an arrow too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m in modules}


def test_every_room_has_a_layer():
    rooms = {_room(m) for m in _modules()} - {None}
    assert rooms == set(ROOM_LAYER), f"rooms without a layer: {rooms - set(ROOM_LAYER)}"


def test_imports_point_down_the_layers_and_nothing_imports_the_command_line():
    modules = _modules()
    upward = []
    for name, path in modules.items():
        room = _room(name)
        for dep in _imported(path, modules):
            dep_room = _room(dep)
            if room is None or dep_room is None or dep_room == room:
                continue
            if ROOM_LAYER[dep_room] > ROOM_LAYER[room]:
                upward.append(f"{name} imports {dep} ({LAYERS[ROOM_LAYER[dep_room]][0]} above "
                              f"{LAYERS[ROOM_LAYER[room]][0]})")  # fmt: skip
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize("limit", [500])
def test_no_module_over_500_lines(limit):
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > limit}
    assert not long, long


def test_no_function_over_60_lines():
    long = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 60:
                    long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "\n".join(long)


def test_the_layer_check_sees_an_upward_import(tmp_path):
    """The check itself can fail: a data module importing the trainer is an upward arrow."""
    fake = tmp_path / "mod.py"
    fake.write_text("from vespo.train.config import TrainConfig\n")
    modules = _modules() | {"vespo.data.fake": fake}
    deps = _imported(fake, modules)
    assert "vespo.train.config" in deps
    assert ROOM_LAYER[_room("vespo.train.config")] > ROOM_LAYER[_room("vespo.data.fake")]
