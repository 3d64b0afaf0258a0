"""Follow one run's `TrainConfig` through the calls of a tiny `vespo train` (issue 41's coupling count).

Runs `vespo train` in-process under `sys.setprofile` and records the module of every Python function called with a
TrainConfig among its arguments (identity, not equality). The config followed is the one `train_sync` (`--async`:
`train_async`) receives, together with the configs it was made from and those made from it by
`TrainConfig.replace` (the run's num_threads, its saved config.yaml): one config, however many objects. Prints
  modules  the distinct modules entered,
  returns  how often the call sequence (consecutive repeats collapsed) comes back to a module it had already left,
           with the returns by module, and the sequence itself.
Main thread only: sampler processes and helper threads are not followed. A test helper
(tests/train/test_train_layout.py); by hand: `python tests/train/_trace_config.py [--async]`.
"""

from __future__ import annotations

import collections
import sys
import tempfile


def trace(argv: list[str]) -> tuple[list[tuple[str, str, int]], dict[int, int]]:
    """The (module, function, config id) of every call that received a TrainConfig, in call order, and the
    `TrainConfig.replace` edges (child id -> parent id); every config seen is kept alive until the run ends, so an id
    names one object."""
    from vespo.cli import main
    from vespo.train.config import TrainConfig

    calls: list[tuple[str, str, int]] = []
    parent: dict[int, int] = {}
    alive: list[object] = []
    replace = TrainConfig.replace.__code__

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "return" and code is replace and type(arg) is TrainConfig:
            alive.append(arg)
            parent[id(arg)] = id(frame.f_locals["self"])
        if event != "call":
            return
        n = code.co_argcount + code.co_kwonlyargcount
        star, starstar = bool(code.co_flags & 0x04), bool(code.co_flags & 0x08)  # *args, **kwargs
        names, local = code.co_varnames[: n + star + starstar], frame.f_locals
        args = [local.get(name) for name in names[:n]]
        if star:
            args += local.get(names[n], ())
        if starstar:
            args += local.get(names[-1], {}).values()
        cfg = next((a for a in args if type(a) is TrainConfig), None)
        if cfg is not None:
            alive.append(cfg)
            calls.append((frame.f_globals.get("__name__", "?"), code.co_name, id(cfg)))

    sys.setprofile(profile)
    try:
        rc = main(argv)
    finally:
        sys.setprofile(None)
    if rc:
        raise SystemExit(f"vespo train exited with {rc}")
    return calls, parent


def count(calls: list[tuple[str, str, int]], parent: dict[int, int], loop: str):
    """(distinct modules, returns, returns by module, collapsed module sequence) of the config `loop` received, its
    ancestors and its descendants through `TrainConfig.replace`."""
    target = next(i for m, f, i in calls if f == loop)
    family, i = {target}, target
    while i in parent:  # ancestors
        i = parent[i]
        family.add(i)
    below = {target}
    while True:  # descendants
        new = {c for c, p in parent.items() if p in below} - below
        if not new:
            break
        below |= new
    family |= below
    seq = [m for m, _, i in calls if i in family]
    collapsed = [m for k, m in enumerate(seq) if k == 0 or seq[k - 1] != m]
    seen: set[str] = set()
    returns: collections.Counter = collections.Counter()
    for m in collapsed:
        if m in seen:
            returns[m] += 1
        seen.add(m)
    return sorted(seen), sum(returns.values()), returns, collapsed


def main() -> None:
    is_async = "--async" in sys.argv[1:]
    with tempfile.TemporaryDirectory() as run, tempfile.TemporaryDirectory() as cache:
        argv = ["train", "--total-training-steps", "1", "--eval-every", "0", "--sft-steps", "2",
                "--train-batch-size", "2", "--ppo-mini-batch-size", "2", "--rollout-n", "2", "--run-dir", run,
                "--cache-dir", cache, "--no-progress", *(["--async"] * is_async)]  # fmt: skip
        calls, parent = trace(argv)
    modules, returns, by_module, collapsed = count(calls, parent, "train_async" if is_async else "train_sync")
    print(f"modules {len(modules)}: {', '.join(modules)}")
    print(f"returns {returns}: {', '.join(f'{m} {n}' for m, n in by_module.most_common())}")
    print("sequence: " + " > ".join(collapsed))


if __name__ == "__main__":
    main()
