"""Build the Results page and the README's numbers from the committed summaries under benchmarks/results, and the
hyperparameter tables of the Methods pages from the loss registry.

One script, so that a number shown anywhere cannot drift from the file it comes from:
`python docs/gen_results.py` rewrites docs/results/index.md, docs/methods/hyperparameters.md and the blocks between
`<!-- gen:NAME -->` and `<!-- /gen:NAME -->` of the README and the Methods pages; `python docs/gen_results.py --check`
writes nothing and exits 1 naming each output that is not current (tests/e2e/test_docs.py runs it). Each section names
the command that produced its summary. Tables computed here use `vespo.experiments.stats.format_ci` (mean ± 95%
t CI over seeds); the benchmarks' own markdown summaries, which their scripts generate from the same runs, are
included as they are.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "results" / "index.md"
HPARAMS = ROOT / "docs" / "methods" / "hyperparameters.md"
METHODS = ROOT / "docs" / "methods"
README = ROOT / "README.md"
BEST = "best_eval_acc"  # the paper's checkpoint rule: the best held-out evaluation of a run

sys.path.insert(0, str(ROOT / "src"))
from vespo.experiments.presets import PRESET_REGIMES  # noqa: E402
from vespo.experiments.reproduce.designs import parse_design, read_text  # noqa: E402
from vespo.experiments.stats import format_ci  # noqa: E402

EVAL_SAMPLES = PRESET_REGIMES["paper-long"][0]["eval_size"] * PRESET_REGIMES["paper-long"][0]["eval_n"]
"""Sampled responses per held-out evaluation of a paper-long cell (its binomial noise floor)."""


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _rows(rel: str) -> list[dict]:
    with (RESULTS / rel).open(newline="") as f:
        return list(csv.DictReader(f))


def _json(rel: str) -> dict:
    return json.loads((RESULTS / rel).read_text())


def _md(rel: str, *, drop_title: bool = True) -> str:
    """A benchmark's own markdown summary, its headings moved under this page's sections."""
    text = (RESULTS / rel).read_text().strip()
    lines = text.splitlines()
    if drop_title and lines and lines[0].startswith("# "):
        lines = lines[1:]
    return "\n".join("###" + line[1:] if line.startswith("## ") else line for line in lines).strip()


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=118, break_on_hyphens=False, break_long_words=False)


def _csv(rel: str) -> str:
    """A small committed CSV as a table, numbers to 3 significant digits."""
    rows = _rows(rel)

    def cell(v: str) -> str:
        try:
            return f"{float(v):.3g}"
        except ValueError:
            return v

    return _table(list(rows[0]), [[cell(v) for v in r.values()] for r in rows])


def _table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


def _source(*rels: str) -> str:
    return "Summary: " + ", ".join(f"`benchmarks/results/{r}`" for r in rels) + "."


def command1() -> dict:
    return _json("default_train/summary.json")


def command1_block() -> str:
    s = command1()
    return (
        f"| `{s['command']}`, {s['steps']} steps | first | last |\n|---|---|---|\n"
        "| training reward (mean of the first 5 / last 10 steps) | "
        f"{s['reward_first']:.3f} | {s['reward_last']:.3f} |\n"
        f"| held-out accuracy (first / last evaluation) | {s['heldout_first']:.3f} | {s['heldout_last']:.3f} |"
    )


def _by_cell(rows: list[dict], metric: str) -> dict[tuple[str, int], list[float]]:
    cells: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r in rows:
        if r.get("gate", "ok") in ("ok", ""):
            cells[r["variant"], int(r["N"])].append(float(r[metric]))
    return cells


def _grid(rel: str, metric: str = BEST, rows: list[dict] | None = None) -> tuple[str, float]:
    """Mean ± 95% CI per variant (rows, VESPO first) and N (columns), and the warm start's accuracy (of `rows`
    where given, else of the summary `rel`)."""
    rows = _rows(rel) if rows is None else rows
    cells = _by_cell(rows, metric)
    ns = sorted({n for _, n in cells})
    variants = sorted({v for v, _ in cells}, key=lambda v: (v != "vespo", v))
    body = [[f"`{v}`"] + [format_ci(cells[v, n]) if (v, n) in cells else "–" for n in ns] for v in variants]
    steps = {n: sorted(int(r["rollout_steps"]) * n for r in rows if int(r["N"]) == n) for n in ns}
    body.append(["optimizer steps per cell"] + [str(steps[n][len(steps[n]) // 2]) for n in ns])
    start = sum(float(r["initial_eval_acc"]) for r in rows) / len(rows)
    return _table(["variant"] + [f"N = {n}" for n in ns], body), start


def readme_block() -> str:
    table, start = _grid("paper_long/results.csv")
    text = (
        "Held-out accuracy on 128-token responses (the embedded chain task, best checkpoint, mean ± 95% CI over "
        f"seeds; the warm start scores {start:.3f}). N is the number of mini-batches per rollout step, so the "
        "last mini-batch is N − 1 steps stale. A cell at larger N also takes more optimizer steps (last row), so "
        "compare methods within a column, not one method across columns. Which differences are significant, and "
        "which comparisons were planned before their runs, is on the Results page."
    )
    return _wrap(text) + "\n\n" + table


def section_command1() -> str:
    s = command1()
    evals = ", ".join(f"step {k}: {v:.3f}" for k, v in s["heldout_per_eval"].items())
    return "\n\n".join(
        [
            "## The trainer's default run (README command 1)",
            f"`python benchmarks/bench_default_train.py` runs `{s['command']}` in a fresh directory. It is "
            "deterministic on one torch thread: the same commit gives the same file.",
            command1_block(),
            f"Held-out accuracy per evaluation (200 prompts): {evals}.",
            _source("default_train/summary.json"),
        ]
    )


def _plan(name: str) -> dict:
    """A committed design's JSON, from its plan file."""
    path = RESULTS / "paper_long" / "plans" / f"{name}.md"
    return parse_design(read_text(path), str(path))


def _confirmed() -> str:
    """One line per confirmatory comparison of the primary rule that has run: its difference, CI, Holm p and verdict
    (with the MDD where unresolved), from verdicts.csv; a line saying which planned designs have not run."""
    rows = [
        r for r in _rows("paper_long/verdicts.csv") if r["registration"] == "confirmatory" and r["primary"] == "True"
    ]
    ran = [r for r in rows if r["tested_seeds"] != "[]" and r["diff"] not in ("", "nan")]
    lines = []
    for r in ran:
        verdict = r["verdict"] + (f" (MDD {float(r['mdd']):.3f})" if r["verdict"] == "unresolved" else "")
        lines.append(
            f"- {r['design']}: {r['name']}, {r['rule']}: {float(r['diff']):+.4f} [{float(r['ci_low']):+.3f}, "
            f"{float(r['ci_high']):+.3f}] over {r['seeds']} seeds, Holm p {float(r['p_adjusted']):.3g} "
            f"(m = {r['family_m']}): {verdict}."
        )
    pending = sorted({r["design"] for r in rows} - {r["design"] for r in ran})
    if pending:
        lines.append("- Planned and committed, cells not run yet: " + ", ".join(pending) + ".")
    unbuilt = [d for d in pending if "builds" not in _plan(d)]
    if unbuilt:
        lines.append(f"- {', '.join(unbuilt)} name the table's warm start and run only where that build is cached; "
                     "no later machine has rebuilt it (docs/guides/paper.md, 'A warm start is a build').")  # fmt: skip
    head = (
        "What the confirmatory designs (plan committed before any of its cells) show, primary rule; a difference is "
        "the other method's accuracy minus VESPO's (fraction):"
    )
    return head + "\n\n" + "\n".join(lines)


def _design_grids() -> list[str]:
    """Each run design's own grid per warm start (its cells are not in the table above: other seeds, warm starts or
    step counts, so their levels differ from it)."""
    out = []
    for path in sorted((RESULTS / "paper_long" / "designs").glob("*/results.csv")):
        rel = str(path.relative_to(RESULTS))
        by_warm = defaultdict(list)
        for r in _rows(rel):
            by_warm[r.get("sft_seed") or "0", r.get("warm_start") or ""].append(r)
        for (sft, build), rows in sorted(by_warm.items(), key=lambda kv: (int(kv[0][0]), kv[0][1])):
            table, start = _grid(rel, rows=rows)
            seeds = sorted({int(r["seed"]) for r in rows})
            built = f" (build {build})" if build else ""
            text = (f"Design `{path.parent.name}`, warm start of SFT seed {sft}{built} (scores {start:.3f}), RL seeds "
                    f"{seeds[0]}-{seeds[-1]}, best checkpoint:")  # fmt: skip
            gain = max(_mean([float(r[BEST]) - float(r["initial_eval_acc"]) for r in rows if r["variant"] == v])
                       for v in {r["variant"] for r in rows})  # fmt: skip
            floor = 2 * (start * (1 - start) / EVAL_SAMPLES) ** 0.5
            if gain < floor:
                text += (f" no method rises more than {floor:.3f} (two binomial SDs of one evaluation) above this warm "
                         "start, so its pairs hold no information on the methods' difference; they still count in "
                         "the planned pooled test, whose CI and MDD they narrow.")  # fmt: skip
            out.append(f"{text}\n\n{table}")
    for path in sorted((RESULTS / "paper_long" / "designs").glob("*/pilots.csv")):
        rows = _rows(str(path.relative_to(RESULTS)))
        tried = [f"SFT seed {r['sft_seed']} (build {r['warm_start']}): {r['variant']} at N = {r['N']}, RL seed "
                 f"{r['seed']}, {float(r['initial_eval_acc']):.3f} -> {float(r['best_eval_acc']):.3f}, "
                 + ("passes" if r["passed"] == "True" else "fails") for r in rows]  # fmt: skip
        out.append(f"Design `{path.parent.name}` chose its warm start by the pilot rule its plan fixed (the first "
                   "candidate whose pilot cell rises 0.05 above its start): " + "; ".join(tried) + ".")  # fmt: skip
    return out


def section_long() -> str:
    table, start = _grid("paper_long/results.csv")
    return "\n\n".join(
        [
            "## Staleness on long responses (`--preset paper-long`)",
            "`vespo reproduce paper-long`: VESPO and the baselines at N = 4, 16, 64 and 128 on the "
            "embedded chain task with 128-token responses, each cell gated on its regime diagnostics. Held-out "
            f"accuracy, best checkpoint, mean ± 95% CI over the gated seeds (warm start {start:.3f}):",
            table,
            _confirmed(),
            *_design_grids(),
            "The tests, their families and the registration of each design, as the command writes them:",
            _md("paper_long/verdicts.md"),
            _source("paper_long/results.csv", "paper_long/verdicts.csv", "paper_long/verdicts.md"),
        ]
    )


def section_short() -> str:
    table, start = _grid("paper_staleness/results.csv")
    return "\n\n".join(
        [
            "## Staleness on short responses (`--preset paper`)",
            "`vespo reproduce paper`: the paper's staleness table on the free-length "
            "scratchpad task (about 10-token responses), 5 seeds. On responses this short VESPO's sequence weights "
            "spread little, so most methods compute nearly the same update. Held-out accuracy, best checkpoint, "
            f"mean ± 95% CI (warm start {start:.3f}):",
            table,
            _md("paper_staleness/verdicts.md"),
            _source("paper_staleness/results.csv", "paper_staleness/verdicts.csv"),
        ]
    )


def section_real_model() -> str:
    rows = _rows("real_model/summary.csv")
    body = [
        [
            f"`{r['method']}`",
            r["N"],
            r["seeds"],
            f"{float(r['before']):.3f}",
            f"{float(r['after']):.3f}",
            f"{float(r['delta']):+.3f} ± {float(r['delta_ci']):.3f}",
            f"{float(r['p_paired_t']):.2g}",
        ]
        for r in rows
    ]
    header = ["method", "N", "seeds", "held-out before", "after", "change (95% CI)", "p (paired t)"]
    return "\n\n".join(
        [
            "## A real model: SmolLM2-135M-Instruct on a reasoning-gym task",
            f"`{_json('real_model/summary.json').get('command', 'python benchmarks/bench_real_model.py')}` "
            "(one GPU). Held-out avg@4 on 40 single-digit sums the training split never shows, before and after "
            "48 optimizer steps. Every arm learns the task; with 3 seeds no ordering of the methods is claimed.",
            _table(header, body),
            _source("real_model/summary.csv", "real_model/summary.json"),
        ]
    )


def section_speed() -> str:
    losses = _rows("losses.csv")
    body = [
        [f"`{r['candidate']}`", r["baseline"], r["median_ms"], r["baseline_median_ms"], r["x_baseline_paired_median"]]
        for r in losses
        if r["baseline"] != "masked sum"
    ]
    parts = [
        "## Speed",
        "### Losses against the engines' own",
        "`python benchmarks/bench_losses.py`: forward and backward of each loss at (B = 256, T = 8192), fp32, one "
        "CPU thread, against the engine's own loss in paired rounds (ratio < 1: vespo is faster).",
        _table(["loss", "engine's loss", "vespo ms", "engine ms", "ratio (paired median)"], body),
        _source("losses.csv", "losses.json"),
    ]
    for title, rel in [
        ("The trainer against TRL, tiny model", "trl_throughput.json"),
        ("The trainer against TRL, SmolLM2-135M", "trl_real/summary.md"),
        ("Where a step's time goes", "step_profile/profile.md"),
        ("Log-probs without the logits tensor", "logprob_memory.md"),
        ("Evaluation against a training step's generation", "eval_speed.md"),
    ]:
        if rel.endswith(".json"):
            d = _json(rel)
            ratio = d["ratio_over_trl"]
            rows = [[f"`{arm}`", f"{v['samples_per_s']:.2f}×", f"{v['reward']:.2f}×"] for arm, v in ratio.items()]
            text = f"`{d['command']}`: samples/s and final training reward, each over TRL's.\n\n" + _table(
                ["arm", "samples/s over TRL", "reward over TRL"], rows
            )
        else:
            text = _md(rel)
        parts += [f"### {title}", text, _source(rel)]
    return "\n\n".join(parts + _retired("speed"))


def section_other() -> str:
    parts = ["## Other measurements"]
    for title, rel in [
        ("Asynchronous training under real lag", "async_lag/summary.md"),
        ("The lab: stale training that collapses", "lab_v2/results.md"),
        ("The lab's failure modes", "lab_v2/failure_modes.md"),
        ("Train-inference mismatch, corrected", "mismatch_corrected/results.md"),
    ]:
        parts += [f"### {title}", _csv(rel) if rel.endswith(".csv") else _md(rel), _source(rel)]
    return "\n\n".join(parts + _retired("other"))


RETIRED_AT = "57ade47"
"""The last commit that holds the finished investigations issue 52 retired (their scripts and summaries)."""
RETIRED = {  # page -> {heading: (summary, script) under benchmarks/ at RETIRED_AT}
    "speed": {
        "torch.compile": ("results/torch_compile.md", "bench_torch_compile.py"),
        "One long cell": ("results/long_cell.md", "bench_long_cell.py"),
        "The update's kernels": ("results/update_kernels.md", "bench_update_kernels.py"),
    },
    "other": {
        "Why VESPO drifts in the lab": ("results/lab_mechanism/results.md", "bench_lab_mechanism.py"),
        "Adaptive VESPO on the lab grid": ("results/adaptive/", "bench_adaptive_goal.py, bench_adaptive_probe.py"),
        "Step-size controls": ("results/step_controls/results.md", "bench_step_controls.py"),
        "The chain task's warm start": ("results/chain_warmstart.md", "bench_chain_warmstart.py"),
        "The code sandbox": ("results/sandbox.md", "bench_sandbox.py"),
        "Workbench speed": ("results/workbench_speed.md", "bench_workbench_speed.py"),
    },
}
"""Finished one-off investigations: their answers stay in git history, not re-run (a heading each, so links hold)."""


def _retired(page: str) -> list[str]:
    """A page's retired investigations: a heading each and where git keeps its summary and script."""
    parts = []
    for title, (rel, script) in RETIRED[page].items():
        parts += [
            f"### {title}",
            f"A finished investigation, retired in issue 52: its summary `benchmarks/{rel}` and "
            f"script `benchmarks/{script}` are in git history (`git show {RETIRED_AT}:benchmarks/{rel}`).",
        ]
    return parts


INTRO = (
    "Conventions: held-out accuracy is a fraction (0–1), the paper's numbers are percentage points; ± is a 95% t "
    "interval over seeds; a comparison is significant at 0.05 after Holm's correction over its family; MDD is the "
    "smallest difference the design detects with 80% power."
)


def _promote(text: str) -> str:
    """One heading level up (### -> ##, #### -> ###): a section that becomes a page of its own."""
    return re.sub(r"(?m)^#(#{2,}) ", r"\1 ", text)


def pages() -> dict[Path, str]:
    """The Results pages: an overview with the default run, then one page per kind of evidence."""
    sub = {
        "staleness.md": ("# Staleness: VESPO against the baselines", [section_long(), section_short()]),
        "real-model.md": ("# A real model", [section_real_model()]),
        "speed.md": ("# Speed", [_promote(section_speed().split("\n\n", 1)[1])]),
        "more.md": ("# More measurements", [_promote(section_other().split("\n\n", 1)[1])]),
    }
    index = [
        "# Results",
        "The one home for vespo's numbers. These pages are generated by `python docs/gen_results.py` from the "
        "summaries committed under `benchmarks/results/`, and a test checks that they are current. Each section "
        "names the command that reruns it. Superseded results are in git history only.",
        INTRO,
        "| page | what it holds |\n|---|---|\n"
        "| [Staleness](staleness.md) | VESPO and the baselines over N, on long and on short responses |\n"
        "| [A real model](real-model.md) | SmolLM2-135M-Instruct trained with VESPO and GRPO on one GPU |\n"
        "| [Speed](speed.md) | the losses against the engines' own, the trainer against TRL, where the time goes |\n"
        "| [More measurements](more.md) | async lag, the lab, adaptive VESPO, step controls, the sandbox |",
        section_command1(),
    ]
    out = {PAGE: "\n\n".join(index) + "\n"}
    for name, (title, sections) in sub.items():
        out[PAGE.parent / name] = "\n\n".join([title, INTRO, *sections]) + "\n"
    return out


def _fill(text: str, blocks: dict[str, str], where: str) -> str:
    """`text` with each `<!-- gen:NAME -->` ... `<!-- /gen:NAME -->` block of `blocks` filled in."""
    for name, block in blocks.items():
        pattern = re.compile(rf"(<!-- gen:{re.escape(name)} -->\n).*?(<!-- /gen:{re.escape(name)} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"{where} has no <!-- gen:{name} --> ... <!-- /gen:{name} --> block")
        text = pattern.sub(lambda m, b=block: m.group(1) + b + "\n" + m.group(2), text)
    return text


def readme(text: str) -> str:
    return _fill(text, {"command1": command1_block(), "readme-results": readme_block()}, "README.md")


def _accepts(kind: object, bound: object | None) -> str:
    """What a hyperparameter accepts: its interval (and why) or its type, as the registry checks it."""
    if bound is not None:
        return f"{bound.text}" + (f" ({bound.reason})" if bound.reason else "")
    name = getattr(kind, "__name__", None)
    if getattr(kind, "__origin__", None) is not None and "Literal" in str(kind):
        return ", ".join(f"`{v!r}`" for v in kind.__args__).replace("'", '"')
    return f"`{name}`" if name and name != "object" else str(kind).replace("typing.", "")


def hparam_table(method: str, *, common: bool = False) -> str:
    """A method's hyperparameters from the registry: default and what `validate_hparams` accepts."""
    from vespo.losses import CORRECTION_OPTIONS
    from vespo.losses.registry import PENALTY_HPARAMS, get_method

    spec = get_method(method)
    names = [k for k in spec.hparams if common or k not in {**CORRECTION_OPTIONS, **PENALTY_HPARAMS}]
    if not names:
        return "No hyperparameters of its own (the train-inference options and `kl_tau` apply)."
    rows = [[f"`{k}`", f"`{spec.hparams[k]!r}`", _accepts(spec.kinds.get(k), spec.bounds.get(k))] for k in names]
    return _table(["hyperparameter", "default", "accepts"], rows)


def hparams_page() -> str:
    import vespo
    from vespo.losses import CORRECTION_OPTIONS

    parts = [
        "# Hyperparameters\n\nGenerated by `python docs/gen_results.py` from the loss registry "
        "(`vespo.method_hparams`, the bounds `vespo.validate_hparams` checks). Every method also takes the "
        "train-inference options (" + ", ".join(f"`{k}`" for k in CORRECTION_OPTIONS) + ") and the penalty "
        "`kl_tau` ([train-inference correction](correction.md)).",
    ]
    for method in vespo.available_methods():
        spec_agg = vespo.losses.default_loss_agg_mode(method)
        parts += [f"## `{method}`", f"Default aggregation: `{spec_agg}`.", hparam_table(method)]
    return "\n\n".join(parts) + "\n"


def methods_pages() -> dict[Path, str]:
    """Each Methods page with its `<!-- gen:hparams:METHOD -->` blocks filled in."""
    pages = {}
    for path in sorted(METHODS.glob("*.md")):
        text = path.read_text()
        names = re.findall(r"<!-- gen:(hparams:[\w-]+) -->", text)
        if names:
            blocks = {n: hparam_table(n.split(":", 1)[1]) for n in names}
            pages[path] = _fill(text, blocks, str(path.relative_to(ROOT)))
    return pages


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if an output is not current")
    args = ap.parse_args(argv)
    outputs = {**pages(), README: readme(README.read_text()), HPARAMS: hparams_page(), **methods_pages()}
    stale = [p for p, text in outputs.items() if not p.is_file() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"{p.relative_to(ROOT)} is not current: run python docs/gen_results.py", file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(outputs[p])
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
