"""Trainer configuration: `TrainConfig`, a run's settings in sections (`vespo.train.fields`), valid once built.

`TrainConfig(**flat)` takes the settings by their flat names (the command line's and YAML's: `lr=1e-3`), builds
each section, which checks its own fields (types and ranges, `vespo.train.checks`, then the rules among them), and
then checks what only sections together say (`_check_consistency`): the checks that need no heavy import (torch,
transformers) first, so that a bad flag is answered at once. What the machine must provide (files, packages,
devices, memory) is checked when a run starts (`vespo.train.host.check_host`). `vespo.train.config_io` reads a
config from YAML and the command line.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

from vespo.train.checks import ConfigError, check_range, conforms, describe_type
from vespo.train.fields import (
    BUILTIN_METHODS,
    EMBEDDED,
    FIELD_TYPES,
    SECTION_OF,
    SECTIONS,
    AlgorithmSettings,
    AsyncSettings,
    BatchSettings,
    DataSettings,
    EmbeddedSettings,
    HardwareSettings,
    OptimizerSettings,
    RolloutSettings,
    RunSettings,
    TrainFields,
    default_reward_fn,
    known_methods,
    rollout_batch_size,
)

if typing.TYPE_CHECKING:
    from vespo.rollout.types import SamplingSettings

__all__ = ["BUILTIN_METHODS", "EMBEDDED", "FIELD_TYPES", "ConfigError", "TrainConfig", "check_range", "conforms",
           "default_reward_fn", "describe_type", "filled", "known_methods"]  # fmt: skip


@dataclass(frozen=True, init=False)
class TrainConfig:
    """A run's settings, valid once built: one section per concern, each checked when built, and together one run
    (the method's hyperparameters, the task, sync/async settings); ConfigError naming the flat field otherwise.
    None stands for a default that is filled in: `run_dir` runs/<method>, `reward_fn` the dataset's reward, and
    `train_batch_size` 16 or N x ppo_mini_batch_size for `staleness` (--num-mini-batches) N."""

    data: DataSettings
    algorithm: AlgorithmSettings
    batch: BatchSettings
    optimizer: OptimizerSettings
    rollout: RolloutSettings
    hardware: HardwareSettings
    async_: AsyncSettings
    embedded: EmbeddedSettings
    run: RunSettings

    def __init__(self, **flat: object) -> None:
        """Build every section from the settings by their flat names (`vespo.train.fields.TrainFields`'s), in order;
        a name of no section is a TypeError, as for any dataclass."""
        unknown = sorted(set(flat) - set(SECTION_OF))
        if unknown and set(unknown) <= set(SECTIONS):  # dataclasses.replace passes the sections
            raise TypeError("TrainConfig takes settings by flat name: cfg.replace(lr=...), not dataclasses.replace")
        if unknown:
            raise TypeError(f"TrainConfig() got unexpected keyword argument(s) {unknown}")
        for attr, section in SECTIONS.items():
            given = {f.name: flat[f.name] for f in dataclasses.fields(section) if f.name in flat}
            if section is RunSettings and given.get("run_dir") is None:
                given["run_dir"] = f"runs/{self.algorithm.method}"
            object.__setattr__(self, attr, section(**given))  # frozen: set once, while it is built
        _check_consistency(self)

    def flat(self) -> dict[str, object]:
        """The settings by their flat names (the command line's and YAML's), in field order: what config.yaml holds
        and what a sweep cell's identity hashes."""
        return {k: v for attr in SECTIONS for k, v in dataclasses.asdict(getattr(self, attr)).items()}

    def replace(self, **changes: object) -> TrainConfig:
        """This config with `changes` to settings by their flat names, checked as a new one."""
        return TrainConfig(**(self.flat() | changes))

    @property
    def sampling(self) -> SamplingSettings:
        """What the generation engine gets of this config (training rollouts; held-out evaluation shares all but n
        and the logit noise)."""
        from vespo.rollout.types import SamplingSettings

        r = self.rollout
        return SamplingSettings(n=self.batch.rollout_n, max_new_tokens=r.max_response_length,
                                temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                                logit_noise_std=r.rollout_logit_noise, dtype=r.sampler_dtype)  # fmt: skip


def filled(fields: TrainFields) -> dict[str, object]:
    """The values `TrainConfig` fills in for None, of unchecked `fields`: run_dir runs/<method>, the dataset's reward,
    and the rollout batch (`rollout_batch_size`; `staleness` then None)."""
    batch = rollout_batch_size(fields.staleness, fields.ppo_mini_batch_size, fields.train_batch_size)
    return {
        "run_dir": f"runs/{fields.method}" if fields.run_dir is None else fields.run_dir,
        "reward_fn": default_reward_fn(fields.dataset) if fields.reward_fn is None else fields.reward_fn,
        "train_batch_size": batch,
        "staleness": None,
    }


def _check_consistency(cfg: TrainConfig) -> None:
    """What no section can see alone: the registry's hyperparameters (importing torch, as the run will, so after
    every section's own checks), the step scale against the method, the task, and the LoRA and async settings."""
    from vespo.embedded.task import check_task
    from vespo.losses import rollout_correction, validate_hparams

    algo, mode = cfg.algorithm, cfg.async_.mode
    try:
        validate_hparams(algo.method, **algo.hparams)
    except ValueError as exc:
        raise ConfigError(f"hparams: {exc}") from None
    if cfg.optimizer.step_scale == "mean_phi" and rollout_correction(algo.method) != "fold":
        raise ConfigError(
            f"step_scale=mean_phi needs a VESPO-family method (it scales by the mean phi(W)); {algo.method!r} has none"
        )
    if algo.adv_estimator == "opob" and (mode != "sync" or cfg.batch.shuffle):
        raise ConfigError(
            "adv_estimator=opob recomputes each mini-batch's baseline from whole groups at its weights: it needs "
            f"mode=sync and shuffle=false, got mode={mode}, shuffle={cfg.batch.shuffle}"
        )
    if cfg.data.dataset == EMBEDDED:
        e = cfg.embedded
        try:
            check_task(e.task, num_operands=e.num_operands, max_operand=e.max_operand, eval_size=cfg.run.eval_size,
                       max_response_length=cfg.rollout.max_response_length)  # fmt: skip
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if cfg.hardware.use_peft and mode == "async":
        raise ConfigError("use_peft is not supported with mode=async yet (samplers load full weights): use mode=sync")
    _check_async(cfg)


def _check_async(cfg: TrainConfig) -> None:
    """The engine's and the async loop's settings (`vespo.train.host` checks that the machine can run them)."""
    a, rollout = cfg.async_, cfg.rollout
    if a.sampler_engine == "vllm" and rollout.rollout_logit_noise > 0:
        raise ConfigError("rollout_logit_noise needs sampler_engine=hf (vLLM's sampler takes no logit noise)")
    if rollout.bypass_mode and a.use_decoupled_loss:
        raise ConfigError(
            "bypass_mode and use_decoupled_loss are exclusive: bypass takes the sampler's log-probs as "
            "old_log_prob, the decoupled loss the learner's"
        )
    if a.mode == "sync":
        if a.use_decoupled_loss:
            raise ConfigError("use_decoupled_loss needs mode=async (in sync mode old_log_prob is already pi_prox)")
        return
    if cfg.optimizer.probe_every:
        raise ConfigError("probe_every needs mode=sync (it probes the stalest of a rollout step's mini-batches)")
    n = cfg.batch.num_mini_batches
    need = n + a.sync_every - 2  # a batch of N mini-batches must fit in the window
    if a.max_staleness < need:
        raise ConfigError(
            f"max_staleness={a.max_staleness} is too small: a batch of N={n} mini-batches with "
            f"sync_every={a.sync_every} needs max_staleness >= N + sync_every - 2 = {need}"
        )
