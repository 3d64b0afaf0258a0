#!/usr/bin/env bash
# veRL from PyPI without its GPU stack (vLLM, flash-attn, its transformers<5.11 pin): only the packages that
# `import verl` (plugin loading), its loss registry, its Hydra config and its FSDP training worker
# (tests/test_verl_workers.py) need. None of them pulls another torch.
set -euo pipefail
pip install -q --no-deps "verl==0.9.1" "tensordict==0.10.0"
# tensordict's own requirements (its torch requirement is already met by the CPU build)
pip install -q "pyvers>=0.1,<0.2" importlib_metadata cloudpickle packaging
# what veRL's config and plugin loading import
pip install -q "ray==2.60.0" "hydra-core==1.3.8" "codetiming==1.4.0" "orjson==3.13.0"
# what veRL's engine worker path imports: rollout-server utilities (uvicorn, fastapi) in engine_workers and the
# checkpoint engine, peft in the FSDP engine
pip install -q "uvicorn==0.54.0" "fastapi==0.165.0" "starlette==1.10.0" "peft==0.21.2"
python -c "import verl.trainer.ppo.core_algos, vespo.integrations.verl, verl.workers.engine_workers, peft"
