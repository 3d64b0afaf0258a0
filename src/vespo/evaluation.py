"""Benchmark evaluation with the paper's protocol: avg@k for math (k=32 AIME, 16 AMC, 4 MATH-500), pass@10 for code.

avg@k is the mean accuracy over k samples per problem, averaged over problems; pass@k is the unbiased estimator of
Chen et al. 2021 ("Evaluating Large Language Models Trained on Code", Eq. 1). Generation goes through the training
loops' own engine (`vespo.rollout.build_engine`: HF or vLLM) with `vespo train`'s thread count, so it costs per sample
what a training step's generation costs (benchmarks/bench_eval_speed.py), scoring through `vespo.rewards`, so training
reward and evaluation share one verifier.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm.auto import tqdm

from vespo.argv import ArgumentParser
from vespo.data import BENCHMARKS, Benchmark, format_prompts, record_kind, resolve_benchmark
from vespo.data.reasoning_gym import PREFIX, is_reasoning_gym
from vespo.outputs import OutputError, OwnedDir, claim, open_regular, write_atomic


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``c`` correct among ``n`` samples: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # product form of the binomial ratio: no huge integers, no cancellation
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def avg_at_k(scores: list[list[float]]) -> float:
    """Mean over problems of the mean score of that problem's samples."""
    if not scores or any(not s for s in scores):
        raise ValueError("avg_at_k needs at least one problem and one sample per problem")
    return sum(sum(s) / len(s) for s in scores) / len(scores)


def mean_pass_at_k(scores: list[list[float]], k: int) -> float:
    """pass@k averaged over problems; a sample counts as correct when its score is 1.0."""
    return sum(pass_at_k(len(s), sum(x == 1.0 for x in s), k) for s in scores) / len(scores)


@dataclass(frozen=True)
class BenchmarkResult:
    """One row of the report: avg@k (= pass@1 estimate) and pass@k, in percent, over ``num_problems``;
    ``partial_samples`` of the ``num_samples`` scored strictly between 0 and 1 (a verifier's partial credit, e.g.
    reasoning-gym's), which avg@k averages as they are and pass@k does not count as correct."""

    benchmark: str
    kind: str
    k: int
    num_problems: int
    avg_at_k: float
    pass_at_k: float
    seconds: float
    num_samples: int
    partial_samples: int

    @property
    def headline(self) -> str:
        """The paper's reported metric for this benchmark."""
        return "pass" if self.kind == "code" else "avg"


def summarize(benchmark: str, kind: str, k: int, scores: list[list[float]], seconds: float = 0.0) -> BenchmarkResult:
    """Report row from per-problem sample scores (each problem needs at least ``k`` samples)."""
    return BenchmarkResult(
        benchmark=benchmark,
        kind=kind,
        k=k,
        num_problems=len(scores),
        avg_at_k=100.0 * avg_at_k(scores),
        pass_at_k=100.0 * mean_pass_at_k(scores, k),
        seconds=seconds,
        num_samples=sum(len(s) for s in scores),
        partial_samples=sum(0.0 < x < 1.0 for s in scores for x in s),
    )


def score_samples(records: list[dict], samples: list[list[str]]) -> list[list[float]]:
    """Per-problem scores of sampled completions, with the verifier of the records' kind (math, code or a
    reasoning-gym task)."""
    from vespo.rewards import score_code, score_math, score_tasks  # torch, sympy: not for `vespo eval --help`

    if len(records) != len(samples):
        raise ValueError(f"got {len(records)} problems but samples for {len(samples)}")
    flat = [c for group in samples for c in group]
    kind = record_kind(records[0])
    column = {"math": "answer", "code": "tests", "task": "rg_item"}[kind]
    targets = [r[column] for r, group in zip(records, samples, strict=True) for _ in group]
    scores = {"math": score_math, "code": score_code, "task": score_tasks}[kind](flat, targets).scores
    out, i = [], 0
    for group in samples:
        out.append(scores[i : i + len(group)])
        i += len(group)
    return out


def sample_completions(
    model,
    tokenizer,
    records: list[dict],
    *,
    n: int,
    chat: bool = False,
    chunk: int = 8,
    desc: str = "",
    seed: int | None = None,
    progress: bool = True,
    use_vllm: bool = False,
    **sampling,
) -> list[list[str]]:
    """``n`` completions per record from the loops' own generation engine (`vespo.rollout.build_engine`: HF on the
    model itself, or vLLM on `model`, a path or an in-memory model), ``chunk`` prompts at a time (each chunk's
    stream seeded ``seed + i``), with a progress bar on stderr (problems done and the time left, redrawn after every
    chunk). ``sampling``: max_new_tokens, temperature, top_p, top_k."""
    import torch

    from vespo.rollout import SamplingSettings, build_engine, decode_responses  # deferred: imports transformers

    prompts = format_prompts(tokenizer, [r["prompt"] for r in records], chat=chat)
    path = model if isinstance(model, str) else None
    if path is not None and not use_vllm:
        from vespo.models import load_model

        model = load_model(path)
    dtype = "auto" if use_vllm else str(next(model.parameters()).dtype).removeprefix("torch.")  # HF: no copy
    settings = SamplingSettings(n=n, dtype=dtype, **sampling)
    engine = build_engine("vllm" if use_vllm else "hf", settings, policy_path=path if use_vllm else None,
                          seed=seed or 0, model=model, tokenizer=tokenizer)  # fmt: skip
    device = torch.device("cpu") if use_vllm else next(model.parameters()).device
    was_training = not use_vllm and model.training
    step = max(1, 64 // n)  # prompts per `generate` call: at most 64 sequences in flight
    samples: list[list[str]] = []
    bar = tqdm(total=len(prompts), desc=desc or "generate", unit="problem", leave=False, mininterval=0,
               file=sys.stderr, disable=not progress)  # fmt: skip
    try:
        with bar:  # a chunk takes seconds to minutes: every one is shown, with tqdm's estimate of the time left
            for i in range(0, len(prompts), chunk):
                generator = torch.Generator(device=device)
                if seed is not None:
                    generator.manual_seed(seed + i)  # distinct streams per chunk, reproducible overall
                for j in range(i, min(i + chunk, len(prompts)), step):
                    texts = decode_responses(engine.tokenizer, engine.generate(prompts[j : min(j + step, i + chunk)],
                                                                               generator))  # fmt: skip
                    samples += [texts[k : k + n] for k in range(0, len(texts), n)]
                bar.update(len(prompts[i : i + chunk]))
    finally:
        if was_training:
            model.train()
    return samples


def sample_scores(model, tokenizer, records: list[dict], *, n: int, **gen_kwargs) -> list[list[float]]:
    """Per-problem scores of ``n`` sampled completions each (`sample_completions`, then `score_samples`)."""
    return score_samples(records, sample_completions(model, tokenizer, records, n=n, **gen_kwargs))


def evaluate_records(model, tokenizer, records: list[dict], *, n: int, name: str = "heldout", **gen_kwargs) -> dict:
    """Score a held-out set with the verifier of its kind (math, code or task): ``eval/<name>/avg@n`` and ``pass@n`` in
    [0, 1]. The one evaluator: the trainer's held-out evaluation and `vespo eval` both come through here."""
    scores = sample_scores(model, tokenizer, records, n=n, desc=f"eval {name}", **gen_kwargs)
    return {f"eval/{name}/avg@{n}": avg_at_k(scores), f"eval/{name}/pass@{n}": mean_pass_at_k(scores, n)}


def evaluate_benchmarks(
    model,
    tokenizer,
    benchmarks: list[Benchmark],
    *,
    limit: int | None = None,
    samples_path: str | Path | None = None,
    **gen_kwargs,
) -> list[BenchmarkResult]:
    """Evaluate on each benchmark with its own k; ``limit`` keeps the first problems only (smoke runs). With
    ``samples_path``, every completion is written there as one JSON line (benchmark, problem index and id, prompt,
    sample index, completion, score), benchmark by benchmark as they finish."""
    results = []
    sink = _open_samples(samples_path) if samples_path is not None else None
    try:
        for bench in tqdm(benchmarks, desc="benchmarks", unit="bench"):
            start = time.perf_counter()
            records = bench.load()[:limit]
            samples = sample_completions(model, tokenizer, records, n=bench.k, desc=bench.name, **gen_kwargs)
            scores = score_samples(records, samples)
            results.append(summarize(bench.name, bench.kind, bench.k, scores, time.perf_counter() - start))
            if sink is not None:
                for i, (record, texts, marks) in enumerate(zip(records, samples, scores, strict=True)):
                    for j, (text, score) in enumerate(zip(texts, marks, strict=True)):
                        row = {"benchmark": bench.name, "problem": i, "id": record.get("id"), "sample": j}
                        sink.write(json.dumps(row | {"prompt": record["prompt"], "completion": text, "score": score}))
                        sink.write("\n")
                sink.flush()
    finally:
        if sink is not None:
            sink.close()
    return results


def _open_samples(path: str | Path):
    """samples.jsonl, started empty: a regular file of its own only (`open_regular`: never through a link or into a
    FIFO; a file with a second hard link is refused before it is emptied, so nothing elsewhere is truncated)."""
    fd = open_regular(path, os.O_WRONLY | os.O_CREAT)
    if os.fstat(fd).st_nlink != 1:
        os.close(fd)
        raise OutputError(f"{path} has other hard links, so it is not vespo's samples file; remove it")
    os.ftruncate(fd, 0)
    return open(fd, "w", encoding="utf-8")


PARTIAL_NOTE = (
    "Partial scores: samples the verifier scored strictly between 0 and 1 (partial credit, e.g. reasoning-gym's). "
    "avg@k averages the scores as they are (a 0.5 counts half), so it need not be a multiple of 100 / (problems x k); "
    "pass@k counts only a score of 1 as correct."
)
"""The note under `vespo eval`'s table when a row has partial scores."""


def markdown_table(results: list[BenchmarkResult]) -> str:
    """Results as a markdown table; the paper's headline metric per row is in bold. A row with partial scores says
    how many, and a note under the table says how avg@k and pass@k treat them."""
    lines = ["| benchmark | problems | k | avg@k (%) | pass@k (%) | partial scores |", "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        avg, pas = f"{r.avg_at_k:.2f}", f"{r.pass_at_k:.2f}"
        avg, pas = (f"**{avg}**", pas) if r.headline == "avg" else (avg, f"**{pas}**")
        partial = f"{r.partial_samples} of {r.num_samples}" if r.partial_samples else "none"
        lines.append(f"| {r.benchmark} | {r.num_problems} | {r.k} | {avg} | {pas} | {partial} |")
    if any(r.partial_samples for r in results):
        lines += ["", PARTIAL_NOTE]
    return "\n".join(lines) + "\n"


def write_report(results: list[BenchmarkResult], out_dir: str | Path, meta: dict | None = None) -> tuple[Path, Path]:
    """Write ``results.md`` and ``results.json`` (rows plus ``meta``: model, sampling settings) to ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / "results.md", out / "results.json"
    write_atomic(md, markdown_table(results))
    write_atomic(js, json.dumps({"meta": meta or {}, "results": [asdict(r) for r in results]}, indent=2))
    return md, js


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def benchmark_names(text: str) -> list[str]:
    """The comma list of --benchmarks; a bare name after a reasoning-gym spec is another task of it
    (``reasoning-gym:chain_sum,leg_counting`` is two benchmarks, one row each)."""
    names: list[str] = []
    for name in (n.strip() for n in text.split(",")):
        if not name:
            continue
        bare = name not in BENCHMARKS and not is_reasoning_gym(name) and not name.endswith((".json", ".jsonl"))
        names.append(PREFIX + name if bare and names and is_reasoning_gym(names[-1]) else name)
    return names


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="vespo eval", description=__doc__.split("\n")[0])
    p.add_argument(
        "--model", required=True, help="local path, .gguf file (dequantised once, cached) or Hub id of a causal LM"
    )
    p.add_argument(
        "--benchmarks",
        default="aime24,aime25,amc23,math500",
        help=f"comma list of {', '.join(BENCHMARKS)}, .json/.jsonl paths, or reasoning-gym:<task>[:key=value...] "
        "(held-out split; reasoning-gym:a,b is two tasks, one row each) (champ, gsm8k-symbolic and humaneval are "
        "offline: pip install 'vespo[benchmarks]')",
    )
    p.add_argument("--k", type=_positive_int, default=None, help="samples per problem (default: the paper's k)")
    p.add_argument("--max-new-tokens", type=_positive_int, default=8192)
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature, > 0")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1]")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0: off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=_positive_int, default=None, help="evaluate only the first N problems of each")
    p.add_argument(
        "--chat",
        action="store_true",
        help="wrap prompts in the tokenizer's chat template (instruct models; as `vespo train --apply-chat-template`)",
    )
    p.add_argument(
        "--backend",
        choices=("hf", "vllm"),
        default="hf",
        help="generation engine: hf (any device) or vllm (CUDA, pip install -e '.[vllm]'; not run on the CPU CI)",
    )
    p.add_argument("--device", default="auto", help="auto (CUDA when present) | cpu | cuda | cuda:<index> (hf backend)")
    p.add_argument(
        "--num-threads",
        type=_positive_int,
        default=None,
        help="torch CPU threads (default: as `vespo train` chooses them, from the model and the free cores)",
    )
    p.add_argument(
        "--out",
        default="eval_results",
        help="directory for results.md, results.json and samples.jsonl: new, empty, or an earlier `vespo eval`'s",
    )
    p.add_argument(
        "--overwrite-output-dir",
        action="store_true",
        help="replace an earlier `vespo eval`'s results in --out (nothing else there is touched)",
    )
    return p


EVAL_OUTPUTS = ("results.md", "results.json", "samples.jsonl")
"""What `vespo eval` writes in --out (the manifest of its marker, `vespo.outputs`)."""


def _is_legacy_report(path: Path) -> bool:
    """An --out written by a vespo before the marker: a results.json of {"meta", "results"}."""
    try:
        with open(path / "results.json", "rb") as f:
            report = json.loads(f.read(1 << 24))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(report, dict) and set(report) == {"meta", "results"}


def claim_out(out: str, overwrite: bool) -> OwnedDir:
    """Claim --out for this evaluation (`vespo.outputs.claim`); an earlier evaluation's results there are replaced
    only with `overwrite` (OutputError otherwise, before the model loads)."""
    owned = claim(out, "eval", EVAL_OUTPUTS, label="--out", overwrite=overwrite, legacy=_is_legacy_report)
    earlier = owned.existing()
    if earlier and not overwrite:
        owned.release()
        raise OutputError(
            f"--out {owned.path} holds an earlier evaluation's {', '.join(earlier)}; pass --overwrite-output-dir to "
            "replace them, or choose another --out"
        )
    owned.clear()
    return owned


def cli(argv: list[str]) -> int:
    """``vespo eval``: check every input, load the model, evaluate the benchmarks, print and write the table."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not (math.isfinite(args.temperature) and args.temperature > 0):
        parser.error(f"--temperature must be a finite number > 0, got {args.temperature}")
    if not 0 < args.top_p <= 1:
        parser.error(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.top_k < 0:
        parser.error(f"--top-k must be an integer >= 0 (0: off), got {args.top_k}")
    from vespo.machine import THREADS_PER_CORE, THREADS_REASON
    from vespo.models import check_model_source, resolve_device  # torch, transformers
    from vespo.rollout.vllm import vllm_available

    if args.num_threads is not None and args.num_threads > THREADS_PER_CORE * (os.cpu_count() or 1):
        parser.error(f"--num-threads must be in [1, {THREADS_PER_CORE * (os.cpu_count() or 1)}] ({THREADS_REASON})")

    try:
        try:
            check_model_source(args.model)
        except ValueError as exc:
            raise ValueError(f"model: {exc}") from None
        names = benchmark_names(args.benchmarks)
        if not names:
            raise ValueError("--benchmarks: give at least one benchmark")
        resolved = [resolve_benchmark(name, k=args.k) for name in names]  # every name checked first
        benchmarks = [_loaded(b) for b in resolved]  # data before the model
        try:
            device = resolve_device(args.device)
        except ValueError as exc:
            raise ValueError(f"--device: {exc}") from None
        if args.backend == "vllm" and not vllm_available():
            raise ValueError("--backend vllm needs vLLM installed (pip install -e '.[vllm]') and a CUDA device")
        out = claim_out(args.out, args.overwrite_output_dir)  # last: a refused command leaves no --out behind
    except ValueError as exc:
        parser.error(str(exc))
    with out, _sigint_in_this_process_only(), _torch_threads(args.model, args.num_threads):
        try:
            return _evaluate(args, device, benchmarks, out.path)
        except KeyboardInterrupt:
            print(f"vespo eval: interrupted; {_kept(out)}", file=sys.stderr)
            return 130


def _kept(out: OwnedDir) -> str:
    """What an interrupted evaluation leaves in --out: the completions of the benchmarks it finished (an empty
    samples.jsonl, which it created, is removed, so nothing is left to refuse a rerun)."""
    samples = out.path / "samples.jsonl"
    if samples.is_file() and samples.stat().st_size == 0:
        samples.unlink()
    if not samples.is_file():
        return "nothing was written to --out"
    done = list(dict.fromkeys(json.loads(line)["benchmark"] for line in samples.read_text().splitlines() if line))
    return (
        f"the completions of {', '.join(done)} are kept in {samples}, no results.md was written; rerun with "
        "--overwrite-output-dir to evaluate again"
    )


@contextlib.contextmanager
def _sigint_in_this_process_only():
    """Ctrl-C raises KeyboardInterrupt in this process only: worker processes forked meanwhile (the math grader's
    pool) inherit a handler that ignores it, so they print no traceback and finish with the pool."""
    main = os.getpid()

    def handler(signum, frame):
        if os.getpid() == main:
            raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: leave Ctrl-C as it is
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _torch_threads(model: str, threads: int | None):
    """torch's CPU threads while evaluating: `threads`, or the count `vespo train` would choose for `model`
    (`vespo.machine.threads_for`, said once on stderr), so generation runs as it does in training (torch's
    default, every core, made it ~10x slower per sample on a loaded 2-core box: thread oversubscription); the
    caller's count is restored after."""
    import torch

    from vespo.machine import threads_for

    if threads is None:
        threads, why = threads_for(model)
        print(f"vespo eval: {why}; --num-threads N to change", file=sys.stderr, flush=True)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _loaded(bench: Benchmark) -> Benchmark:
    """`bench` with its records read now: a benchmark that cannot be read (a Hub set offline) is one line before the
    model loads, not a traceback after it."""
    try:
        records = bench.load()
    except (ValueError, OSError) as exc:
        raise ValueError(f"--benchmarks {bench.name}: {exc}") from None
    return dataclasses.replace(bench, load=lambda: records)


def _evaluate(args: argparse.Namespace, device, benchmarks: list[Benchmark], out: Path) -> int:
    """`vespo eval` once every input is checked and --out is claimed: load, evaluate, write and print the table."""
    from vespo.models import load_policy, load_tokenizer

    if args.backend == "vllm":
        model, tokenizer = args.model, load_tokenizer(args.model)  # vLLM loads the weights itself
    else:
        model, tokenizer = load_policy(args.model)
        model.to(device)
    gen = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p,
           "top_k": args.top_k}  # fmt: skip
    gen["use_vllm"] = args.backend == "vllm"
    samples = out / "samples.jsonl"
    results = evaluate_benchmarks(
        model, tokenizer, benchmarks, limit=args.limit, seed=args.seed, chat=args.chat, samples_path=samples, **gen
    )
    md, js = write_report(results, out, meta={"model": args.model, "seed": args.seed, "chat": args.chat, **gen})
    print(md.read_text(), end="")
    print(f"wrote {md}, {js} and {samples} (every completion with its score)")
    return 0
