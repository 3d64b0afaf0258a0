#!/usr/bin/env bash
# veRL in its own venv (default: .venv-verl inside the clone). veRL 0.9.1 pins transformers < 5.11, while vespo's main
# venv carries the newest transformers (TRL, GGUF loading); so veRL gets its own venv with its own pins and its full
# dependency list (its GPU stack, vLLM / SGLang / flash-attn, is not among its requirements), vespo's veRL plugin is
# tested there under veRL's own versions, and `pip check` passes in both venvs. Usage: bash .ci/install_verl.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-verl}"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q torch==2.13.0 ${TORCH_INDEX:+--index-url "$TORCH_INDEX"}  # first, as in .ci/run
"$venv/bin/pip" install -q -e ".[test,verl]"
"$venv/bin/pip" check
"$venv/bin/python" -c "import verl.trainer.ppo.core_algos, vespo.integrations.verl, verl.workers.engine_workers, verl.trainer.ppo.v1, peft"
