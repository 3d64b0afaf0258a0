"""`vespo train`: parse the config (valid once built), check that this machine can run it, then run the loop it names
(sync or async). The loops never import each other; this is the one place that picks one. torch and transformers are
imported once the config is valid, so `--help` and bad input are answered at once."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from vespo.deadline import sigterm_as_interrupt
from vespo.train.config import EMBEDDED, ConfigError, TrainConfig
from vespo.train.config_io import parse_fields
from vespo.train.host import check_host
from vespo.train.resume import continue_same_run


def train(cfg: TrainConfig) -> dict[str, float]:
    """Run RL training per `cfg` (sync or async, per `cfg.async_.mode`); returns the last step's metrics. What the run
    needs of this machine is checked before any compute (`check_host`; `cfg` itself was checked when it was built)."""
    check_host(cfg)
    from vespo.models import quiet_hf_progress
    from vespo.train.runs import claim_run_dir

    if not cfg.run.progress:
        quiet_hf_progress()
    if cfg.async_.mode == "async":
        from vespo.train.async_ import train_async as loop
    else:
        from vespo.train.sync import train_sync as loop
    with claim_run_dir(cfg.run) as out:  # the run dir is vespo's and this process's until the run ends
        return loop(cfg, out)


def _interrupted(cfg: TrainConfig | None) -> str:
    """What an interrupted run leaves: a checkpoint to resume from, or a run dir a new run will reuse."""
    if cfg is None:
        return "nothing was started"
    from vespo.embedded.warm_start import WarmStartSpec, unfinished
    from vespo.train.resume import CHECKPOINT

    run_dir = Path(cfg.run.run_dir).expanduser()
    partial = unfinished(WarmStartSpec.of(cfg)) if cfg.data.model == EMBEDDED else None
    if partial is not None and not (run_dir / CHECKPOINT).is_file():
        return f"the warm start's progress is kept in {partial} and the next run resumes it"
    if (run_dir / CHECKPOINT).is_file():
        return f"the last checkpoint in {run_dir} is kept (the same command continues from it)"
    first = min(cfg.run.save_every, cfg.batch.total_training_steps)
    return f"no checkpoint was saved yet (the first is at step {first}); running again starts over in {run_dir}"


def cli(argv: list[str]) -> int:
    """`vespo train [--config file.yaml] [flags]`."""
    cfg = None
    try:
        fields = continue_same_run(parse_fields(argv))  # a run dir of another run is refused before torch loads
        cfg = TrainConfig(**vars(fields))
        from vespo.checkpoints import CheckpointError
        from vespo.rewards.batch import GraderHostError

        try:
            with sigterm_as_interrupt():  # a scheduler's or a grid's stop: the same clean stop as Ctrl-C
                last = train(cfg)
        except GraderHostError as exc:  # never scored as wrong answers: the run stops before it trains on them
            print(f"vespo train: grading failed on this host: {exc}; {_interrupted(cfg)}", file=sys.stderr)
            return 1
        except CheckpointError as exc:  # a save the file system refused (a full disk): the last one is intact
            print(f"vespo train: error: {exc}", file=sys.stderr)
            return 1
    except ConfigError as exc:  # bad input, found before any compute
        print(f"vespo train: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"vespo train: interrupted; {_interrupted(cfg)}", file=sys.stderr)
        return 130
    print(json.dumps({k: round(v, 4) for k, v in last.items() if k.startswith(("reward/", "eval/"))}))
    print(f"run dir: {cfg.run.run_dir}")
    return 0


def export_checkpoint(run_dir: str | Path, out: str | Path, *, checkpoint: str = "last") -> Path:
    """Write a run's checkpoint (`checkpoints/last.pt`, or `step_<K>` with `--save-total-limit`) as a Hugging Face
    model directory `out` (new or empty; nothing is replaced): the run's policy rebuilt from its config.yaml, the
    checkpoint's weights loaded into it, LoRA adapters merged (`vespo.train.runs.save_policy`). ConfigError (one line)
    for anything that does not fit, before the model loads where it can be checked."""

    from vespo.checkpoints import MODEL
    from vespo.embedded.warm_start import WarmStartSpec, embedded_policy_path
    from vespo.models import add_lora, load_policy
    from vespo.outputs import OutputError, check_new_dir
    from vespo.train.config_io import load_yaml
    from vespo.train.resume import load_checkpoint
    from vespo.train.runs import RUN_OUTPUTS, save_policy

    run_dir = Path(run_dir).expanduser()
    try:  # first: a link, a file on its way, a read-only parent or a run's own final/ is refused before anything loads
        out = check_new_dir(out, label="--out", owned=(run_dir, "train", RUN_OUTPUTS))  # marked or not
    except OutputError as exc:
        raise ConfigError(str(exc)) from None
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"run_dir {run_dir}: no config.yaml (not a vespo run dir)")
    name = "last" if checkpoint == "last" else checkpoint.removesuffix(".pt")
    ckpt_path = run_dir / "checkpoints" / f"{name}.pt"
    if not ckpt_path.is_file():
        kept = sorted(p.stem for p in (run_dir / "checkpoints").glob("*.pt"))
        raise ConfigError(f"--checkpoint: no {ckpt_path}; this run keeps {kept or 'no checkpoints'}")
    cfg = TrainConfig(**load_yaml(run_dir / "config.yaml", label="config.yaml"))
    state = load_checkpoint(run_dir, ckpt_path, label="--checkpoint")[MODEL]  # truncated, foreign: one line
    policy = embedded_policy_path(WarmStartSpec.of(cfg)) if cfg.data.model == EMBEDDED else cfg.data.model
    try:
        model, tokenizer = load_policy(policy, cache_dir=cfg.run.cache_dir)  # a GGUF: the run's own cache
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.hardware.use_peft:
        model = add_lora(model, cfg.hardware)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise ConfigError(
            f"--checkpoint {ckpt_path} does not fit the run's model: {(str(exc).splitlines() or ['?'])[0][:160]}"
        ) from None
    save_policy(model, tokenizer, out)
    return out


def export_cli(argv: list[str]) -> int:
    """`vespo export RUN_DIR --out DIR [--checkpoint last|step_K]`."""
    from vespo.argv import ArgumentParser

    parser = ArgumentParser(
        prog="vespo export",
        description="Write a run's checkpoint as a Hugging Face model directory (LoRA merged) that from_pretrained "
        "and `vespo eval --model` load.",
    )
    parser.add_argument("run_dir", help="the run directory (its config.yaml and checkpoints/)")
    parser.add_argument("--out", required=True, help="new or empty directory for the model")
    parser.add_argument("--checkpoint", default="last", help="last (default), or step_K with --save-total-limit > 1")
    args = parser.parse_args(argv)
    try:
        print(export_checkpoint(args.run_dir, args.out, checkpoint=args.checkpoint))
    except ConfigError as exc:
        print(f"vespo export: error: {exc}", file=sys.stderr)
        return 2
    return 0
