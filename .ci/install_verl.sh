#!/usr/bin/env bash
# veRL from PyPI without dependencies, plus the packages `import verl.trainer.ppo.core_algos` needs.
set -euo pipefail
pip install -q --no-deps "verl==0.9.1"
