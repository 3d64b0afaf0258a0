"""Any vespo policy loss inside TRL's `GRPOTrainer` (https://github.com/huggingface/trl), overriding only the loss.

`VespoGRPOTrainer` keeps TRL's generation, rewards, advantages, buffering (`steps_per_generation`, `num_iterations`)
and vLLM support, and replaces `_compute_loss` by `vespo.losses.policy_loss_terms` + `vespo.aggregation.agg_loss`,
normalised so that the micro-batches of one optimizer step add up to the loss of the whole step, as TRL does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vespo.aggregation import LOSS_AGG_MODES, agg_loss, masked_mean
from vespo.integrations import engine_names
from vespo.losses import (
    CORRECTION_OPTIONS,
    BatchContext,
    PolicyBatch,
    batch_context,
    default_loss_agg_mode,
    kl_k3,
    policy_loss_terms,
    rollout_correction,
    uses_batch_context,
    uses_rollout_log_prob,
    validate_hparams,
)

Tensor = torch.Tensor
# the engine, imported when this module is (the core install has no TRL)
GRPOConfig, GRPOTrainer = engine_names(__name__, "TRL", "pip install 'vespo[trl]'", "trl", "GRPOConfig", "GRPOTrainer")

# Model-forward inputs TRL may carry for multimodal models; passed through unchanged.
_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")  # TRL's vLLM IS modes
_FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)


@dataclass
class VespoGRPOConfig(GRPOConfig):
    """`GRPOConfig` plus the vespo method that computes the loss.

    Parameters:
        vespo_method (`str`, *optional*, defaults to `"vespo"`):
            Any of `vespo.available_methods()`. TRL's `loss_type`, `epsilon*`, `vespo_k_*` and `sapo_*` are not read.
        vespo_hparams (`dict` or `str`, *optional*):
            Keyword hyperparameters of the method (`vespo.method_hparams(vespo_method)`); unset ones keep the paper
            defaults. From TRL's CLI a JSON object: `--vespo_hparams '{"c1_pos": 2.0}'`.
        vespo_loss_agg_mode (`str`, *optional*):
            One of `vespo.aggregation.LOSS_AGG_MODES`; defaults to the method's own (token-mean; seq-mean-token-mean
            for GSPO). "seq-mean-token-sum-norm" divides by `max_completion_length`, like TRL's "dr_grpo".
    Train-inference correction: TRL's own (`vllm_importance_sampling_*`, any of its four modes) hands vespo a ready
    ratio; or, with `vllm_importance_sampling_correction=False` and vLLM, vespo's rollout-correction options in
    `vespo_hparams` (veRL's names: `rollout_is`, `rollout_is_threshold`, `rollout_rs`, `rollout_rs_threshold`) correct
    from TRL's sampling log-probs. TRL options the vespo loss does not implement (`importance_sampling_level=
    "sequence"`, `top_entropy_quantile`, `off_policy_mask_threshold` (vespo's is the method `opsm`), `delta`, entropy
    bonus) raise instead of being ignored. Refused as traps: `token_mask` with a method that folds the ratio into its
    sequence weight (one masked token sets the whole sequence's W to 1e-8, phi ~ 0, as TRL's own vespo does), and
    `opsm` with TRL's correction on (it needs TRL's sampling log-probs, and vespo receives only the ratio).
    """

    vespo_method: str = field(
        default="vespo", metadata={"help": "vespo policy-loss method (vespo.available_methods())."}
    )
    vespo_hparams: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "Hyperparameters of vespo_method: a dict, or a JSON object from the CLI ('{\"c1_pos\": 2.0}')."
        },
    )
    vespo_loss_agg_mode: str | None = field(default=None, metadata={"help": "Loss aggregation; None = method default."})

    def __post_init__(self) -> None:
        self.vespo_hparams = _hparams_dict(self.vespo_hparams)
        super().__post_init__()
        unsupported = {
            "importance_sampling_level": self.importance_sampling_level != "token",
            "top_entropy_quantile": self.top_entropy_quantile < 1.0,
            "off_policy_mask_threshold": self.off_policy_mask_threshold is not None,
            "delta": self.delta is not None,
            "entropy_coef": self.entropy_coef != 0.0 or self.use_adaptive_entropy,
        }
        bad = [name for name, is_set in unsupported.items() if is_set]
        if bad:
            raise ValueError(
                f"VespoGRPOTrainer does not implement the TRL option(s) {bad}; leave them at defaults"
                + " (off-policy sequence masking is vespo_method='opsm')" * ("off_policy_mask_threshold" in bad)
            )
        if self.vespo_loss_agg_mode is not None and self.vespo_loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(
                f"vespo_loss_agg_mode must be one of {list(LOSS_AGG_MODES)}, got {self.vespo_loss_agg_mode!r}"
            )
        if self.vllm_importance_sampling_mode not in _IS_MODES:
            raise ValueError(
                f"vllm_importance_sampling_mode={self.vllm_importance_sampling_mode!r} is not one VespoGRPOTrainer "
                f"knows; use one of {list(_IS_MODES)}"
            )
        options = sorted(set(self.vespo_hparams) & set(CORRECTION_OPTIONS))
        if options and not self.use_vllm:
            raise ValueError(
                f"vespo_hparams {options} correct with the sampler's log-probs, which TRL has only from vLLM: set "
                "use_vllm=True, or drop them"
            )
        if options and self.vllm_importance_sampling_correction:
            raise ValueError(
                f"vespo_hparams {options} and TRL's vLLM importance sampling would correct twice: set "
                "vllm_importance_sampling_correction=False (vespo then corrects from TRL's sampling log-probs), or "
                "drop them and use vllm_importance_sampling_mode / vllm_importance_sampling_clip_max"
            )
        try:
            validate_hparams(self.vespo_method, **self.vespo_hparams)  # the core's one check of names and values
        except ValueError as exc:
            raise ValueError(f"vespo_hparams: {exc}") from None
        trl_ratio = self.use_vllm and self.vllm_importance_sampling_correction
        mode = self.vllm_importance_sampling_mode
        if trl_ratio and mode == "token_mask" and rollout_correction(self.vespo_method) == "fold":
            raise ValueError(
                f"vllm_importance_sampling_mode='token_mask' with vespo_method={self.vespo_method!r}: a masked token's "
                "ratio 0 enters the sequence weight W as log 1e-8, so one masked token sets phi(W) of its whole "
                "sequence to ~0 (TRL's own vespo does the same); use token_truncate, or sequence_mask to drop whole "
                "sequences on purpose"
            )
        if trl_ratio and uses_rollout_log_prob(self.vespo_method):
            raise ValueError(
                f"vespo_method={self.vespo_method!r} measures its divergence from TRL's sampling log-probs, and with "
                "TRL's vLLM importance sampling vespo receives only the ratio: set "
                "vllm_importance_sampling_correction=False (add vespo_hparams rollout_is/rollout_is_threshold to "
                "correct from the sampling log-probs)"
            )


def _hparams_dict(value: object) -> dict[str, Any]:
    """`vespo_hparams` as a dict: a dict as given, None as {}, a JSON object string (TRL's CLI) parsed; else a one-line
    ValueError naming the field."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"vespo_hparams must be a JSON object, e.g. '{{\"c1_pos\": 2.0}}': {exc}") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(
            f"vespo_hparams must be a mapping of hyperparameter names to values (or a JSON object string), got "
            f"{type(value).__name__}"
        )
    return dict(value)


def _check_hub_model(model: object) -> None:
    """A Hub id given as `model` loads in seconds or fails in one line: when the Hub cannot be used (offline mode, or
    unreachable) the cached copy is read without retries, and without one a ValueError says so before TRL starts."""
    if not isinstance(model, str) or Path(model).expanduser().exists():
        return
    from vespo.data.hub import hub_offline_reason

    reason = hub_offline_reason()
    if reason is None:
        return
    import huggingface_hub
    import huggingface_hub.constants

    try:
        cached = huggingface_hub.try_to_load_from_cache(model, "config.json")
    except ValueError:  # not a valid Hub id
        cached = None
    if not isinstance(cached, str):
        raise ValueError(
            f"model {model!r}: the Hugging Face Hub cannot be used ({reason}) and there is no cached copy; pass a "
            "local model directory or a loaded model"
        ) from None
    huggingface_hub.constants.HF_HUB_OFFLINE = True  # read the cache, no retries


def _loss_mask(inputs: dict[str, Any]) -> Tensor:
    """(B, T) the completion tokens the loss sees (TRL's completion mask, times its tool mask if any)."""
    mask = inputs["completion_mask"]
    return mask if inputs.get("tool_mask") is None else mask * inputs["tool_mask"]


class VespoGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` whose policy loss is a vespo method (`VespoGRPOConfig.vespo_method`).

    Off-policy inputs: `old_per_token_logps` is the behaviour policy mu (TRL leaves it None when generation and
    optimisation are aligned; then mu = pi and W = 1). With vLLM importance-sampling correction, TRL's truncated ratio
    mu / pi_vllm is handed to the core as `rollout_is_weights` (folded into W for "vespo", multiplying the per-token
    loss for the other methods). The KL term (`beta`) is added as TRL adds it. Metrics are vespo's names
    ("is/log_w_mean", "weight/mean_pos", "vespo/Z", "clip/frac", "loss/pg", ...), averaged over processes, plus
    TRL's "entropy" and "kl".
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        model = kwargs["model"] if "model" in kwargs else args[0] if args else None
        if isinstance(
            model, str
        ):  # a .gguf file (or a dir holding one): its dequantised checkpoint, docs/guides/models.md
            from vespo.models import model_path

            model = model_path(model)
            if "model" in kwargs:
                kwargs["model"] = model
            else:
                args = (model, *args[1:])
        _check_hub_model(model)
        super().__init__(*args, **kwargs)
        self._vespo_pending: dict[str, list[tuple[tuple[str, ...], Tensor]]] = {"train": [], "eval": []}
        if not isinstance(self.args, VespoGRPOConfig):
            raise ValueError(f"VespoGRPOTrainer needs a VespoGRPOConfig, got {type(self.args).__name__}")
        if self.aux_loss_enabled:
            raise ValueError(
                "VespoGRPOTrainer does not implement the MoE router auxiliary loss; set router_aux_loss_coef=0"
            )
        self.vespo_loss_agg_mode = self.args.vespo_loss_agg_mode or default_loss_agg_mode(self.args.vespo_method)
        self._vespo_context: tuple[int, BatchContext] | None = None  # (first micro-batch of the step, its statistics)
        generate_every = self.args.steps_per_generation * self.num_iterations
        if uses_batch_context(self.args.vespo_method) and generate_every % self.args.gradient_accumulation_steps:
            raise ValueError(
                f"vespo_method={self.args.vespo_method!r} needs steps_per_generation * num_iterations "
                f"({generate_every}) to be a multiple of gradient_accumulation_steps "
                f"({self.args.gradient_accumulation_steps}), so that each optimizer step uses one generation batch"
            )

    def _compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> Tensor:
        per_token_logps, entropies = self._log_probs(model, inputs, compute_entropy=True)  # (B, T) each
        old = inputs.get("old_per_token_logps")
        old = per_token_logps.detach() if old is None else old  # None: generation and update aligned, mu = pi
        batch = self._policy_batch(inputs, per_token_logps, old)
        mask = batch.response_mask  # (B, T)

        loss_mat, metrics = policy_loss_terms(
            self.args.vespo_method,
            batch,
            allow_empty_rows=True,  # TRL pads micro-batches and masks tool tokens
            validate=False,  # model log-probs; no host sync per micro-batch
            **({"batch_context": self._step_context(model)} if uses_batch_context(self.args.vespo_method) else {}),
            **self._loss_hparams(),
        )
        mode = "train" if self.model.training else "eval"
        pg_loss = agg_loss(loss_mat, mask, self.vespo_loss_agg_mode, **self._global_counts(inputs, mask, mode))
        loss = pg_loss
        if self.beta != 0.0:  # k3 KL to the reference model, as TRL computes it
            per_token_kl = kl_k3(inputs["ref_per_token_logps"] - per_token_logps)  # (B, T) KL(pi || ref), as TRL
            if self.args.use_bias_correction_kl:
                per_token_kl = per_token_kl * torch.exp(per_token_logps - old)
            kl = agg_loss(per_token_kl, mask, self.vespo_loss_agg_mode, **self._global_counts(inputs, mask, mode))
            loss = loss + self.beta * kl
            metrics["kl"] = masked_mean(per_token_kl.detach(), mask)
        metrics["loss/pg"] = pg_loss.detach()
        metrics["entropy"] = masked_mean(entropies.detach(), mask)
        self._log_vespo_metrics(metrics, mode)
        return loss

    def _policy_batch(self, inputs: dict[str, Any], log_prob: Tensor, old: Tensor) -> PolicyBatch:
        """A micro-batch's loss inputs, with the train-inference correction's: with vespo's rollout-correction options,
        TRL's vLLM sampling log-probs (vespo corrects; a NaN log-prob, which vLLM may leave, counts as ratio 1, as TRL
        does); otherwise TRL's ready vLLM importance-sampling ratio at its level, (B, T) token modes, (B, 1) sequence
        ones."""
        if any(k in self.args.vespo_hparams for k in CORRECTION_OPTIONS) or uses_rollout_log_prob(
            self.args.vespo_method
        ):
            sampled = inputs.get("sampling_per_token_logps")
            rollout = {"rollout_log_prob": None if sampled is None else torch.where(sampled.isnan(), old, sampled)}
        else:
            level = "sequence" if self.args.vllm_importance_sampling_mode.startswith("sequence") else "token"
            rollout = {"rollout_is_weights": inputs.get("importance_sampling_ratio"), "rollout_is_level": level}
        return PolicyBatch(log_prob, old, inputs["advantages"], _loss_mask(inputs), **rollout)

    def _loss_hparams(self) -> dict[str, object]:
        """The method's hyperparameters; a method that reads the sampling log-probs (`opsm`) without vespo's correction
        options takes no importance weight from them (`rollout_is=None`), as TRL with its correction off."""
        hp = dict(self.args.vespo_hparams)
        if uses_rollout_log_prob(self.args.vespo_method) and not set(hp) & set(CORRECTION_OPTIONS):
            hp["rollout_is"] = None
        return hp

    def _log_probs(self, model: torch.nn.Module, inputs: dict[str, Any], compute_entropy: bool) -> tuple[Tensor, Any]:
        """Per-token log-probs (B, T) of a micro-batch's completions under `model` (and entropies if asked)."""
        logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model,
            torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1),
            inputs["completion_ids"].size(1),
            compute_entropy=compute_entropy,
            **{k: inputs.get(k) for k in _FORWARD_KEYS},
        )
        return logps, entropies

    def _step_context(self, model: torch.nn.Module) -> BatchContext:
        """The batch-deciding methods' statistics (adaptive VESPO, M2PO) for the current optimizer step, computed once
        per step and cached.

        Train: the step's accumulation window is micro-batches `_step - _step % GA` .. + GA - 1 of TRL's generation
        buffer (`_step` counts micro-batches and advances after the loss; the window lies in one generation batch,
        checked in `__init__`). At its first micro-batch one no-grad forward over the window gives every sequence's
        log W and every token's M2PO trust-region M2 (`vespo.losses.adaptive.batch_context`, as the loss computes
        them), gathered across processes, so every micro-batch of every process decides on the same statistics, as
        one pass over the step's inputs would. k is
        the step's position among the N = steps_per_generation * num_iterations / GA steps that reuse the generation
        batch. Eval: nothing is accumulated; the call's own batch decides (k = 0, N = 1).
        """
        if not self.model.training:
            return BatchContext(mini_batch_index=0, num_mini_batches=1)
        ga = self.args.gradient_accumulation_steps
        start = self._step - self._step % ga
        if self._vespo_context is not None and self._vespo_context[0] == start:
            return self._vespo_context[1]
        generate_every = self.args.steps_per_generation * self.num_iterations  # micro-steps per generation batch
        num_mini_batches = generate_every // ga  # N: the optimizer steps that reuse one generation batch
        rows, m2 = [], []  # per micro-batch: (b, 3) log W, A, valid; M2PO's trust-region M2 of its tokens, flat
        with torch.no_grad():
            for step in range(start, start + ga):
                mb = self._buffered_inputs[step % self.args.steps_per_generation]
                log_prob, _ = self._log_probs(model, mb, compute_entropy=False)
                old = mb.get("old_per_token_logps")
                old = log_prob if old is None else old
                ctx = batch_context(
                    self._policy_batch(mb, log_prob, old),
                    **{k: v for k, v in self._loss_hparams().items() if k in CORRECTION_OPTIONS},
                )
                rows.append(torch.stack([ctx.log_w, ctx.advantages, ctx.valid.to(ctx.log_w.dtype)], -1))
                m2.append(ctx.m2.flatten())
        local = torch.cat(rows)  # (GA * B, 3)
        every = self.accelerator.gather(self.accelerator.pad_across_processes(local, dim=0))  # padding: valid = 0
        every_m2 = self.accelerator.gather(self.accelerator.pad_across_processes(torch.cat(m2), pad_index=-1.0))
        ctx = BatchContext(
            log_w=every[:, 0],
            advantages=every[:, 1],
            valid=every[:, 2] > 0,
            mini_batch_index=(start % generate_every) // ga,
            num_mini_batches=num_mini_batches,
            m2=every_m2,  # padding -1: not a trust-region token
        )
        self._vespo_context = (start, ctx)
        return ctx

    def _global_counts(self, inputs: dict[str, Any], mask: Tensor, mode: str) -> dict[str, Any]:
        """Denominators that make the micro-batches of one optimizer step sum to the step's loss (TRL's normaliser).

        token-mean: tokens per process per accumulation window, num_items_in_batch / processes * GA / spg (TRL's
        dapo/cispo/vespo normaliser); sequence modes: rows per process per window, B * GA (TRL's grpo). In eval
        nothing is accumulated.
        """
        accum = self.current_gradient_accumulation_steps if mode == "train" else 1
        if self.vespo_loss_agg_mode == "token-mean":
            tokens = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":
                tokens = tokens * accum / self.args.steps_per_generation
            return {"global_num_tokens": tokens}
        counts: dict[str, Any] = {"global_num_seqs": mask.shape[0] * accum}
        if self.vespo_loss_agg_mode == "seq-mean-token-sum-norm":
            counts["loss_scale_factor"] = self.max_completion_length
        return counts

    def _log_vespo_metrics(self, metrics: dict[str, Tensor], mode: str) -> None:
        """Keep this micro-batch's metrics as one (K,) tensor until `log` (no host sync per micro-batch)."""
        names = tuple(metrics)
        self._vespo_pending[mode].append((names, torch.stack([metrics[k].float().reshape(()) for k in names])))

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's `log`, after the pending vespo metrics have moved into `self._metrics`."""
        self._flush_vespo_metrics()
        super().log(logs, start_time)

    def _flush_vespo_metrics(self) -> None:
        """Move the pending vespo metrics into TRL's `self._metrics`, averaged over processes with one gather and
        one host sync per logged step."""
        for mode, pending in self._vespo_pending.items():
            if not pending:
                continue
            local = torch.stack([values for _, values in pending])  # (M, K), K fixed by the method and beta
            gathered = self.accelerator.gather(local).reshape(-1, *local.shape).mean(0)  # (M, K)
            for (names, _), row in zip(pending, gathered.tolist(), strict=True):
                for name, value in zip(names, row, strict=True):
                    self._metrics[mode][name].append(value)
            pending.clear()


__all__ = ["VespoGRPOConfig", "VespoGRPOTrainer"]
