"""vespo's checkpoints: one schema of named keys for the two kinds it writes, a training run's state
(`checkpoints/last.pt`: `vespo.train.resume`) and an unfinished embedded warm start (`embedded-<key>.partial.pt`:
`vespo.embedded.warm_start`); one writer (`save`, through `vespo.outputs.write_atomic`) and one reader (`load`).

A file is a dict of tensors and plain containers (no pickled code): `FORMAT_KEY` and `KIND_KEY` beside the kind's
fields (`FIELDS`). `load` reads it with ``weights_only=True`` (a crafted pickle cannot run code) and checks every
field (weights and optimizer state finite), so a damaged, diverged or foreign file is refused with one line before
a model loads. Files from before the format (format 1: the same fields, no header) load as the kind asked for, so a
run started then still resumes. A save the file system refuses (a full disk) is one line too, and leaves the
previous file whole.
"""

from __future__ import annotations

import errno
import random
from pathlib import Path

import numpy as np
import torch

from vespo.outputs import write_atomic

FORMAT = 2
"""The layout `save` writes; `load` reads 1 (no header: vespo before this module) and 2."""
FORMAT_KEY, KIND_KEY = "format", "kind"
RUN, WARM_START = "run", "warm_start"
"""The two kinds: a training run's checkpoint, an unfinished SFT warm start."""

STEP, MODEL, OPTIMIZER, RNG = "step", "model", "optimizer", "rng"
"""Every kind: steps done (the next one to run), weights, optimizer state, RNG streams (`RNG_STREAMS`)."""
SCHEDULER, SCALER, ASYNC = "scheduler", "scaler", "async"
"""A run's when it has them: LR scheduler, fp16 grad scaler, the async loop's {NEXT_BATCH: id}."""
NEXT_BATCH = "next_batch"
LOSSES, SETTINGS_KEY, TOTAL_STEPS = "losses", "key", "steps"
"""A warm start's: one SFT loss per step done, the hash of its settings, the steps it runs in all."""

FIELDS = {
    RUN: ((STEP, MODEL, OPTIMIZER, RNG), (SCHEDULER, SCALER, ASYNC)),
    WARM_START: ((STEP, MODEL, OPTIMIZER, RNG, LOSSES, SETTINGS_KEY, TOTAL_STEPS), ()),
}
"""Each kind's (required, optional) fields."""
RNG_STREAMS = {RUN: ("torch", "python", "numpy", "sampler"), WARM_START: ("torch", "python")}
"""The RNG states each kind keeps: torch's and Python's global streams, NumPy's, the sampling-noise generator (a
run); the CPU torch stream and the SFT batch drawer's `random.Random` (a warm start)."""


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used or written: one line naming the file and what is wrong."""


def save(path: str | Path, kind: str, state: dict) -> None:
    """Write checkpoint `state` (fields of `kind`) to `path` whole, with the format header: `torch.save` through
    `write_atomic`, so a kill leaves the old file or the new one. ValueError for a field outside the schema (a
    caller's bug: what is written must load); CheckpointError, one line, when the file system refuses the write (a
    full disk: the previous checkpoint is intact and no partial file is left)."""
    required, optional = FIELDS[kind]
    wrong = [k for k in required if k not in state] + [k for k in state if k not in required + optional]
    if wrong:
        raise ValueError(f"a {kind} checkpoint has fields {list(required + optional)}; got {sorted(state)}")
    path = Path(path)
    header = {FORMAT_KEY: FORMAT, KIND_KEY: kind}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, lambda f: torch.save(header | state, f))
    except (OSError, RuntimeError) as exc:  # torch.save reports a failed write as a RuntimeError in its context
        cause = next((e for e in _chain(exc) if isinstance(e, OSError)), None)
        if cause is None:
            raise
        code = errno.errorcode.get(cause.errno, "") if cause.errno else ""
        why = f"{cause.strerror or cause}" + (f" ({code})" if code else "")
        kept = f"the previous checkpoint {path} is intact" if path.is_file() else "no earlier checkpoint exists"
        raise CheckpointError(
            f"saving checkpoint {path} (step {state[STEP]}) failed: {why}; {kept} and no partial file was left"
        ) from None


def _chain(exc: BaseException | None):
    """`exc` and the exceptions it was raised from or during (bounded: a chain can be a cycle)."""
    for _ in range(16):
        if exc is None:
            return
        yield exc
        exc = exc.__cause__ or exc.__context__


def load(path: str | Path, kind: str, *, label: str) -> dict:
    """The fields of the `kind` checkpoint at `path` (header dropped), loaded with ``weights_only=True`` and checked
    field by field (`check`). CheckpointError, one line starting with `label`, when the file is missing, truncated,
    not a torch file, not a vespo checkpoint of this kind, from a newer format, or damaged."""
    try:
        ckpt = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # missing, truncated zip, foreign format, a pickle asking for globals weights_only refuses
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{label}: cannot load checkpoint {path}: {first}") from None
    required, optional = FIELDS[kind]
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{label}: {path} is not a vespo checkpoint (needs keys {list(required)})")
    version = ckpt.pop(FORMAT_KEY, 1)
    if version != 1 and not (_is_index(version, 2) and version <= FORMAT and KIND_KEY in ckpt):
        raise CheckpointError(f"{label}: {path} has checkpoint format {version!r:.20}; this vespo reads 1 to {FORMAT}")
    found = ckpt.pop(KIND_KEY, kind)
    if found != kind:
        raise CheckpointError(f"{label}: {path} is a {found!r:.40} checkpoint, not a {kind} one")
    if any(k not in ckpt for k in required):
        raise CheckpointError(f"{label}: {path} is not a vespo checkpoint (needs keys {list(required)})")
    problem = check(kind, ckpt)
    if problem:
        raise CheckpointError(
            f"{label}: {path} is damaged: {problem}" + (_survivors(Path(path)) if kind == RUN else "")
        )
    return ckpt


def _survivors(path: Path) -> str:
    """What else a run keeps beside its damaged checkpoint `path`: the earlier `step_<K>.pt` saves
    (`save_total_limit` > 1) that are not the same file, which `vespo export --checkpoint step_K` reads."""
    try:
        earlier = sorted(
            (p for p in path.parent.glob("step_*.pt") if p.stem[5:].isdigit() and not _same(p, path)),
            key=lambda p: int(p.stem[5:]),
        )
    except OSError:
        earlier = []
    if not earlier:
        return "; no earlier checkpoint of this run is kept (--save-total-limit K keeps the last K)"
    names = ", ".join(p.stem for p in earlier[-4:])
    return f"; earlier checkpoints survive in {path.parent}: {names} (vespo export --checkpoint {earlier[-1].stem})"


def _same(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:
        return False


def check(kind: str, ckpt: dict) -> str | None:
    """What is wrong with the fields of a loaded `kind` checkpoint (None: nothing): no unknown field, the step, the
    weights and optimizer containers, every RNG state (each tried on a throwaway generator, never on the global
    streams), and the kind's own fields. Shapes against a model are checked when it is loaded into one."""
    required, optional = FIELDS[kind]
    unknown = [k for k in ckpt if k not in required + optional]
    if unknown:
        return f"unknown entries {unknown!r:.80} (a {kind} checkpoint has {list(required + optional)})"
    if not _is_index(ckpt[STEP], 1):
        return f"step must be an integer >= 1, got {ckpt[STEP]!r:.60}"
    model = ckpt[MODEL]
    if not isinstance(model, dict) or not all(isinstance(k, str) and torch.is_tensor(v) for k, v in model.items()):
        return "model must be a mapping of parameter names to tensors"
    bad = next((k for k, v in model.items() if not _finite(v)), None)
    if bad is not None:
        return f"its weights are not finite (NaN or inf in {bad[:80]!r}): the run diverged before this save"
    opt = ckpt[OPTIMIZER]
    groups, state = (opt.get("param_groups"), opt.get("state")) if isinstance(opt, dict) else (None, None)
    if not (
        isinstance(groups, list)
        and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups)
        and isinstance(state, dict)
        and all(isinstance(v, dict) for v in state.values())
    ):
        return "optimizer must be a torch optimizer state ({'state': {...}, 'param_groups': [...]})"
    bad = next((f"{i}.{k}"[:80] for i, v in state.items() for k, t in v.items() if not _finite(t)), None)
    if bad is not None:
        return f"its optimizer state is not finite (NaN or inf in state {bad}): the run diverged before this save"
    problem = _check_rng(ckpt[RNG], RNG_STREAMS[kind])
    if problem:
        return problem
    return (_check_run if kind == RUN else _check_warm_start)(ckpt)


def _check_rng(rng: object, streams: tuple[str, ...]) -> str | None:
    if not isinstance(rng, dict) or any(k not in rng for k in streams):
        return f"rng must be a mapping with {', '.join(streams[:-1])} and {streams[-1]} states"
    for name in ("torch", "sampler"):
        if name not in streams:
            continue
        try:
            torch.Generator().set_state(rng[name])
        except (RuntimeError, TypeError, ValueError):
            return f"rng.{name} is not a torch CPU generator state"
    try:
        random.Random().setstate(rng["python"])
    except (TypeError, ValueError, OverflowError):
        return "rng.python is not a Python random state"
    if "numpy" in streams:
        try:
            np.random.RandomState().set_state(_numpy_state(rng["numpy"]))
        except (KeyError, TypeError, ValueError, AttributeError, RuntimeError, OverflowError):
            return "rng.numpy is not a NumPy random state"
    return None


def _check_run(ckpt: dict) -> str | None:
    for name in (SCHEDULER, SCALER):
        if name in ckpt and not (isinstance(ckpt[name], dict) and all(isinstance(k, str) for k in ckpt[name])):
            return f"{name} must be a mapping of state names to values"
    if ASYNC in ckpt and not (isinstance(ckpt[ASYNC], dict) and _is_index(ckpt[ASYNC].get(NEXT_BATCH))):
        return "async.next_batch must be an integer >= 0"
    return None


def _check_warm_start(ckpt: dict) -> str | None:
    if not (isinstance(ckpt[SETTINGS_KEY], str) and _is_index(ckpt[TOTAL_STEPS], 1)):
        return "key must be a string and steps an integer >= 1"
    if ckpt[STEP] >= ckpt[TOTAL_STEPS]:
        return f"step {ckpt[STEP]} is not below steps {ckpt[TOTAL_STEPS]} (a finished warm start is a directory)"
    losses = ckpt[LOSSES]
    if not (isinstance(losses, list) and len(losses) == ckpt[STEP] and all(isinstance(x, float) for x in losses)):
        return f"losses must be a list of {ckpt[STEP]} floats, one per step done"
    return None


def _finite(value: object) -> bool:
    """False only for a floating-point (or complex) tensor holding a NaN or an infinity."""
    if not torch.is_tensor(value) or not (value.is_floating_point() or value.is_complex()):
        return True
    return bool(torch.isfinite(value).all())


def _is_index(value: object, lo: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= lo


def rng_state(gen: torch.Generator) -> dict:
    """A run's RNG streams (`RNG_STREAMS[RUN]`) as tensors and plain Python values (loadable with weights_only)."""
    np_name, np_key, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),  # (version, tuple of ints, None)
        "numpy": {"name": np_name, "key": torch.from_numpy(np_key.astype(np.int64)), "pos": int(np_pos)}
        | {"has_gauss": int(np_has_gauss), "gauss": float(np_gauss)},
        "sampler": gen.get_state(),
    }


def set_rng_state(state: dict, gen: torch.Generator) -> None:
    """Restore the streams saved by `rng_state`."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(_numpy_state(state["numpy"]))
    gen.set_state(state["sampler"])


def _numpy_state(n: dict) -> tuple:
    """`rng_state`'s NumPy entry as the tuple `np.random.set_state` takes."""
    return n["name"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]
