#!/usr/bin/env bash
# The release tier: build the sdist and wheel, check them with twine, install the wheel in a fresh venv with only
# torch and numpy, and run the README's loss snippet there (the core install). pip's cache is reused, so only the
# venv is new. Usage: bash .ci/wheel.sh (from the main venv, which has build and twine: the [test] extra).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
python -m build -q --outdir "$out/dist" . >/dev/null
twine check --strict "$out"/dist/*
python3 -m venv "$out/venv"
"$out/venv/bin/pip" install -q --upgrade pip
"$out/venv/bin/pip" install -q torch==2.13.0 "$out"/dist/vespo-*.whl
"$out/venv/bin/pip" check
cd "$out"  # not the clone: the installed wheel is what runs
"$out/venv/bin/python" - "$OLDPWD/README.md" <<'PY'
import importlib.metadata as md
import re
import sys

readme = open(sys.argv[1]).read()
section = readme.split("\n## Quick start 1: the loss in your own PyTorch code\n", 1)[1].split("\n## ", 1)[0]
[code] = re.findall(r"```python\n(.*?)```", section, re.S)
exec(compile(code, "README.md", "exec"), {})  # the README's loss snippet, verbatim
import vespo
import vespo.diagnostics
import vespo.kernels

assert vespo.__file__.startswith(sys.prefix), vespo.__file__  # the wheel, not the clone
heavy = sorted(m for m in ("transformers", "datasets", "math_verify", "matplotlib", "scipy", "yaml", "tyro") if m in sys.modules)
assert not heavy, f"the core imported {heavy}"
requires = [r for r in md.requires("vespo") if "extra ==" not in r]
assert sorted(r.split(">")[0].split("=")[0].strip() for r in requires) == ["numpy", "torch"], requires
print(f"ci: wheel vespo {md.version('vespo')}: the README loss snippet ran with torch and numpy only")
PY
"$out/venv/bin/vespo" --version
for integration in trl verl; do  # without its engine, one line naming the install command
    if "$out/venv/bin/python" -c "import vespo.integrations.$integration" 2>"$out/err"; then
        echo "ci: vespo.integrations.$integration imported without its engine"; exit 1
    fi
    tail -n 1 "$out/err"
done
