#!/usr/bin/env bash
# veRL from PyPI without its GPU stack (vLLM, flash-attn, its transformers<5.11 pin): only the packages that
# `import verl` (plugin loading), its loss registry and its Hydra config need. None of them pulls another torch.
set -euo pipefail
pip install -q --no-deps "verl==0.9.1" "tensordict==0.10.0"
# tensordict's own requirements (its torch requirement is already met by the CPU build)
pip install -q "pyvers>=0.1,<0.2" importlib_metadata cloudpickle packaging
# what veRL's config and plugin loading import
pip install -q "ray==2.60.0" "hydra-core==1.3.8" "codetiming==1.4.0" "orjson==3.13.0"
python -c "import verl.trainer.ppo.core_algos, vespo.integrations.verl"
