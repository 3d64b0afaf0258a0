"""The learner: log-probs of a rollout under the policy, the N sequential mini-batch update, and the step's metrics.

Every loop calls it (sync, async, and any user loop): it takes explicit settings (`UpdateSettings`), never a run
config, and keeps metrics as tensors until `to_floats` converts a whole logged step at once (one host sync).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import transformers

from vespo import diagnostics, step_control
from vespo.advantages import opob_advantages
from vespo.aggregation import agg_loss
from vespo.checkpoints import MODEL, OPTIMIZER, SCALER, SCHEDULER
from vespo.losses import (
    CORRECTION_OPTIONS,
    BatchContext,
    PolicyBatch,
    batch_context,
    check_policy_inputs,
    compute_policy_loss,
    default_loss_agg_mode,
    kl_k3,
    uses_batch_context,
    validate_hparams,
)
from vespo.losses.core import row_sum, seq_log_ratio, token_log_ratio, top_share
from vespo.rollout import Rollout, response_log_probs
from vespo.step_control import sampler_log_w, scale_step

Tensor = torch.Tensor
_ADDITIVE = ("loss/pg", "actor/kl_loss")  # metrics that are micro-batch shares of a mini-batch total
PER_INDEX = (
    "is/log_w_mean",
    "is/log_w_max",
    "is/log_w_min",
    "weight/ess",
    "is/ess",
    "is/top1pct_w_share",
    "actor/grad_norm",
    "actor/update_norm",
    "is/kl_mu_pi",
    "is/log_w_std",
    diagnostics.MEAN_PHI,
    "actor/momentum_share",
    "actor/step_ess",
    "clip/frac",
)
"""Mini-batch metrics also logged for the first and the last mini-batch of a step (docs/results/index.md,
mechanism); the last mini-batch's `is/kl_mu_pi`, `is/log_w_std`, `vespo/Z`, `actor/momentum_share` and `clip/frac`
(the share of tokens a clipping method clipped) are the regime diagnostics at the stalest mini-batch
(`vespo.diagnostics`); `actor/step_ess` is VCPO's ESS (with `step_scale="ess_sqrt"`)."""


@dataclass(frozen=True)
class UpdateSettings:
    """What the N-mini-batch update needs, and nothing else (a loop builds it from its own config)."""

    method: str = "vespo"
    """Registered policy-loss method."""
    hparams: dict = field(default_factory=dict)
    """Its hyperparameters (validated by the registry when the config was built)."""
    loss_agg_mode: str | None = None
    """Aggregation; None = the method's own."""
    num_mini_batches: int = 1
    """N: sequential optimizer steps per update, one per mini-batch (the paper's staleness ratio gbs/mbs)."""
    seqs_per_mini_batch: int = 64
    """Sequences per optimizer step (prompts per mini-batch x rollout_n)."""
    micro_batch_size: int = 64
    """Sequences per forward/backward pass (accumulation; does not change the result)."""
    temperature: float = 1.0
    """Sampling temperature the log-probs are taken at."""
    top_p: float = 1.0
    """Nucleus mass of the sampling distribution the log-probs are taken under."""
    top_k: int = 0
    """Top-k truncation of the sampling distribution (0: off)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL penalty to the reference (needs ref_log_prob)."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus."""
    grad_clip: float = 1.0
    """Max global gradient norm per optimizer step."""
    shuffle: bool = False
    """Shuffle rows before cutting mini-batches (global RNG)."""
    log_update_norm: bool = False
    """Log the size of each optimizer step (one copy of the weights per mini-batch)."""
    step_scale: str = "none"
    """Step control (`vespo.step_control`): "mean_phi" scales each mini-batch's optimizer step by its mean VESPO weight
    Z = mean phi(W) (at most 1), so a stale mini-batch whose phi shrank moves the weights less (Adam's normaliser
    otherwise undoes the scale of phi); "ess_sqrt" by sqrt of the normalised ESS of its sequence weights pi/pi_sampler
    (VCPO's rule)."""
    adv_estimator: str = "grpo"
    """"grpo": the advantages the loop passes; "opob": VCPO's off-policy optimal baseline, recomputed per mini-batch
    from the rewards at the mini-batch's weights (`opob_advantages`; one backward per sequence)."""
    group_size: int = 8
    """Responses per prompt (consecutive rows), for "opob"."""
    norm_adv_by_std: bool = True
    """"opob": divide by the group's reward std (VCPO's `norm_by_std`)."""
    target_kl: float | None = None
    """Stop the update (skip the rest of the rollout's mini-batches) once the k3 estimate of KL(mu || pi) on the
    next mini-batch exceeds this (PPO's target_kl); None never stops."""
    autocast_dtype: torch.dtype | None = None
    """bf16/fp16 autocast of the policy's forward passes (None: full precision); log-softmax and the loss stay fp32."""

    @property
    def log_prob_args(self) -> dict:
        """How `policy_log_probs` must be called so old log-probs match the update's (W == 1 at k = 0)."""
        return {
            "micro_batch_size": self.micro_batch_size,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "autocast_dtype": self.autocast_dtype,
        }

    @property
    def agg_mode(self) -> str:
        """The aggregation in use: `loss_agg_mode`, or the method's own default."""
        return self.loss_agg_mode or default_loss_agg_mode(self.method)


class Learner:
    """The trained side of a run: the policy, its optimizer, LR scheduler, fp16 loss scaler and KL reference, and the
    N-mini-batch update (`ppo_update`). Both loops call it; its `state_dict` is what a checkpoint holds of it."""

    def __init__(
        self,
        model: transformers.PreTrainedModel,
        optimizer: torch.optim.Optimizer,
        settings: UpdateSettings,
        *,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        scaler: torch.amp.GradScaler | None = None,
        reference: Callable[..., Tensor] | None = None,
    ):
        self.model, self.optimizer, self.settings = model, optimizer, settings
        self.scheduler, self.scaler, self.reference = scheduler, scaler, reference

    @torch.no_grad()
    def log_probs(self, rollout: Rollout) -> Tensor:
        """(B, T) log-probs of the rollout under the current weights: the old log-probs (W == 1 at mini-batch 0)."""
        self.model.eval()
        rows = torch.arange(rollout.response_mask.shape[0])
        return policy_log_probs(self.model, rollout, rows, **self.settings.log_prob_args)[0]

    def reference_log_probs(self, rollout: Rollout) -> Tensor | None:
        """(B, T) log-probs of the rollout under the KL reference (None without a KL penalty)."""
        if self.reference is None:
            return None
        return self.reference(rollout, torch.arange(rollout.response_mask.shape[0]), **self.settings.log_prob_args)

    def update(
        self,
        rollout: Rollout,
        advantages: Tensor,
        old_log_prob: Tensor | None = None,
        *,
        ref_log_prob: Tensor | None = None,
        rollout_log_prob: Tensor | None = None,
        rewards: Tensor | None = None,
        probe: bool = False,
    ) -> dict[str, Tensor]:
        """`settings.num_mini_batches` sequential optimizer steps on the rollout (`ppo_update`); the update's metrics
        summarised over its mini-batches, as tensors. `rewards` (B,): needed by `adv_estimator="opob"`. `probe`: run
        the gradient probe on the stalest mini-batch.

        `old_log_prob` None: the rollout was sampled from the current weights, so mu is scored here under them, with
        mini-batch 0's rows taken from that mini-batch's own forward (the same weights: W == 1 exactly), TRL's
        on-policy shortcut, which saves the scoring forward at N = 1 and 1/N of it otherwise (a policy with active
        dropout is scored by a separate eval-mode forward instead); the gap between mu and the sampler's log-probs is
        then logged as `mismatch/*` (the train-inference mismatch, paper Sec. 4.6)."""
        scored = old_log_prob is None
        if scored and _has_dropout(self.model):
            old_log_prob = self.log_probs(rollout)
        in_update = old_log_prob is None
        buffer = torch.zeros_like(rollout.rollout_log_prob) if in_update else old_log_prob
        self.model.train()
        history = ppo_update(
            self.model,
            self.optimizer,
            rollout,
            advantages,
            buffer,
            self.settings,
            ref_log_prob=ref_log_prob,
            rollout_log_prob=rollout_log_prob,
            rewards=rewards,
            scheduler=self.scheduler,
            scaler=self.scaler,
            score_old=in_update,
            probe=probe,
        )
        self.model.eval()
        return summarize_update(history) | (mismatch_metrics(buffer, rollout) if scored else {})

    def state_dict(self) -> dict:
        """Weights, optimizer, and the scheduler's and scaler's states when there are any: tensors and plain
        containers only (a checkpoint loads with weights_only=True)."""
        extra = ((SCHEDULER, self.scheduler), (SCALER, self.scaler))
        return {MODEL: self.model.state_dict(), OPTIMIZER: self.optimizer.state_dict()} | {
            name: obj.state_dict() for name, obj in extra if obj is not None
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict()` in place. ValueError naming the first mismatch when the weights are another model's,
        or when the state lacks what this learner has (a scheduler or a scaler)."""
        want, got = self.model.state_dict(), state[MODEL]
        problem = next((f"{k} is missing" for k in want if k not in got), None)
        problem = problem or next((f"{k} is not a parameter of the model" for k in got if k not in want), None)
        shapes = ((k, list(got[k].shape), list(v.shape)) for k, v in want.items())
        problem = problem or next((f"{k} has shape {a}, the model {b}" for k, a, b in shapes if a != b), None)
        extra = ((SCHEDULER, self.scheduler), (SCALER, self.scaler))
        missing = (f"it has no {name} state" for name, obj in extra if obj is not None and name not in state)
        problem = problem or next(missing, None)
        if problem:
            raise ValueError(problem)
        try:
            self.model.load_state_dict(got)
            self.optimizer.load_state_dict(state[OPTIMIZER])
            for name, obj in extra:
                if obj is not None:
                    obj.load_state_dict(state[name])
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(" ".join(str(exc).split())[:200] or type(exc).__name__) from None


def micro_batches(rows: Tensor, size: int) -> list[Tensor]:
    """`rows` cut into consecutive chunks of at most `size` (gradient accumulation)."""
    return list(rows.split(size))


def autocast(model, dtype: torch.dtype | None):
    """Mixed-precision context for `model`'s forward on its own device (a no-op when `dtype` is None)."""
    return torch.autocast(next(model.parameters()).device.type, dtype=dtype, enabled=dtype is not None)


def policy_log_probs(
    model,
    rollout: Rollout,
    rows: Tensor,
    *,
    micro_batch_size: int,
    temperature: float,
    autocast_dtype: torch.dtype | None = None,
    top_p: float = 1.0,
    top_k: int = 0,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """log pi (and entropy) of `rows`, (len(rows), T), computed micro-batch by micro-batch as the update sees them,
    under the sampling distribution (temperature, top_p, top_k)."""
    with autocast(model, autocast_dtype):
        outs = [
            response_log_probs(
                model, rollout.select(mb), temperature=temperature, top_p=top_p, top_k=top_k, with_entropy=with_entropy
            )
            for mb in micro_batches(rows, micro_batch_size)
        ]
    logp = torch.cat([o[0] for o in outs])  # (len(rows), T)
    ent = torch.cat([o[1] for o in outs]) if with_entropy else None
    return logp, ent


def ppo_update(
    model: transformers.PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    rollout: Rollout,
    advantages: Tensor,
    old_log_prob: Tensor,
    settings: UpdateSettings,
    *,
    ref_log_prob: Tensor | None = None,
    rollout_log_prob: Tensor | None = None,
    rewards: Tensor | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    scaler: torch.amp.GradScaler | None = None,
    score_old: bool = False,
    probe: bool = False,
) -> list[dict[str, Tensor]]:
    """One optimizer step per mini-batch, in order (rows shuffled first with `settings.shuffle`); returns their
    metrics as 0-dim tensors.

    Mini-batch k (0-based) is trained after k updates of the weights old_log_prob was computed with, so its
    importance weights W = pi/mu are exactly 1 for k = 0 and drift from 1 afterwards (the staleness of Sec. 4.3).
    `score_old`: `old_log_prob` is a buffer filled here with mu under the weights before the first step: the rows of
    mini-batches 1..N-1 by one no-grad forward first, mini-batch 0's from its own forward (`Learner.update`).
    `rollout_log_prob` (the sampler's log-probs, or None) enters the loss as its train-inference correction. The
    rollout batch is validated once here; the micro-batch calls skip validation. `scheduler` steps after every
    optimizer step; `scaler` (fp16) scales the loss. `settings.adv_estimator="opob"` replaces each mini-batch's
    advantages by VCPO's baseline from `rewards` at the mini-batch's weights (rows in whole groups: shuffle off).
    The gradient (`accumulate_gradients`), the regime diagnostics (`mini_batch_diagnostics`) and the step
    (`optimizer_step`) are documented where they are computed. `probe`: the gradient probe (`_gradient_probe`,
    `probe/*`) on the last (stalest) mini-batch, under the weights its optimizer step starts from.
    """
    s = settings
    check_policy_inputs(log_prob=None, old_log_prob=old_log_prob, advantages=advantages,
                        response_mask=rollout.response_mask, rollout_log_prob=rollout_log_prob)  # fmt: skip
    n_rows = advantages.shape[0]
    order = torch.randperm(n_rows) if s.shuffle else torch.arange(n_rows)  # global RNG: checkpointed
    opob = s.adv_estimator == "opob"
    if opob:
        if rewards is None or s.shuffle:
            raise ValueError("adv_estimator='opob' needs the rewards and whole groups per mini-batch (shuffle off)")
        advantages = advantages.clone()  # each mini-batch's rows are overwritten with the baseline at its weights
    params = [p for group in optimizer.param_groups for p in group["params"]]  # all weights, or the LoRA adapters
    if score_old and n_rows > s.seqs_per_mini_batch:  # the stale mini-batches' mu, before any step
        later = order[s.seqs_per_mini_batch :]
        with torch.no_grad():
            old_log_prob[later] = policy_log_probs(model, rollout, later, **s.log_prob_args)[0]
    history = []
    for k in range(s.num_mini_batches):
        # 1. the mini-batch's rows; mini-batch 0's own forward gives its mu when scoring here
        rows = order[k * s.seqs_per_mini_batch : (k + 1) * s.seqs_per_mini_batch]
        on_policy = score_old and k == 0
        optimizer.zero_grad(set_to_none=True)
        sums: dict[str, Tensor] = {}
        if opob:  # VCPO's baseline at the weights this mini-batch is trained from
            log_v = opob_log_weights(model, rollout, rows, old_log_prob, rollout_log_prob, s, on_policy)  # (M,)
            advantages[rows] = opob_advantages(rewards[rows], s.group_size, log_v, norm_by_std=s.norm_adv_by_std)
            sums["opob/baseline_gap"] = _baseline_gap(rewards[rows], advantages[rows], s)
        # 2. the policy loss's gradient, accumulated over micro-batches
        ctx = _batch_context(model, rollout, rows, advantages, old_log_prob, rollout_log_prob, s, k,
                             len(micro_batches(rows, s.micro_batch_size)), on_policy)  # fmt: skip
        mini_lp, loss_metrics = accumulate_gradients(model, rollout, rows, advantages, old_log_prob, s,
                                                     rollout_log_prob=rollout_log_prob, ref_log_prob=ref_log_prob,
                                                     ctx=ctx, score_old=on_policy, scaler=scaler)  # fmt: skip
        sums |= loss_metrics
        # 3. clip; the regime diagnostics; one host sync: a non-finite gradient is skipped, a KL past target_kl stops
        finite, stop = mini_batch_diagnostics(sums, optimizer, params, mini_lp, old_log_prob[rows],
                                              rollout.response_mask[rows], s, scaler)  # fmt: skip
        if probe and k == s.num_mini_batches - 1:  # off the hot path: one more forward, at the caller's stride
            sums |= _gradient_probe(model, params, rollout, rows, advantages, old_log_prob, rollout_log_prob, s, ctx)
        if stop:  # PPO's early stop: this and the remaining (staler) mini-batches are not trained on
            optimizer.zero_grad(set_to_none=True)
            history.append({key: v.detach() for key, v in sums.items()})
            break
        # 4. the optimizer step (scaled by a step control)
        rollout_rows = None if rollout_log_prob is None else rollout_log_prob[rows]
        inputs = (sums, mini_lp, old_log_prob[rows], rollout_rows, rollout.response_mask[rows])
        sums |= optimizer_step(optimizer, params, finite, step_scale=s.step_scale, log_update_norm=s.log_update_norm,
                               scaler=scaler, scheduler=scheduler, step_inputs=inputs)  # fmt: skip
        history.append({key: v.detach() for key, v in sums.items()})
    return history


def accumulate_gradients(
    model,
    rollout: Rollout,
    rows: Tensor,
    advantages: Tensor,
    old_log_prob: Tensor,
    s: UpdateSettings,
    *,
    rollout_log_prob: Tensor | None,
    ref_log_prob: Tensor | None,
    ctx: BatchContext | None,
    score_old: bool,
    scaler: torch.amp.GradScaler | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Backward of mini-batch `rows`' loss, micro-batch by micro-batch: the method's policy loss (paper Eq. 9 for
    VESPO) plus `kl_coef` x the k3 KL to the reference minus `entropy_coeff` x the entropy, each normalised by the
    whole mini-batch's token/sequence count, so accumulating them equals one big batch. With `score_old` each
    micro-batch's own log pi is its mu (written into `old_log_prob`). Returns the detached log pi (M, T) in `rows`
    order and the loss metrics (losses add up over micro-batches, diagnostics average)."""
    mode, mini_mask = s.agg_mode, rollout.response_mask[rows]
    counts = {"global_num_tokens": mini_mask.sum().float(), "global_num_seqs": (mini_mask.sum(-1) > 0).sum().float()}
    micro = micro_batches(rows, s.micro_batch_size)
    sums: dict[str, Tensor] = {}
    mini_log_prob = []
    for mb in micro:
        mask = rollout.response_mask[mb]  # (b, T)
        with autocast(model, s.autocast_dtype):
            log_prob, entropy = response_log_probs(model, rollout.select(mb), temperature=s.temperature, top_p=s.top_p,
                                                   top_k=s.top_k, with_entropy=s.entropy_coeff > 0)  # fmt: skip
        if score_old:
            old_log_prob[mb] = log_prob.detach()
        loss, metrics = compute_policy_loss(
            s.method,
            log_prob=log_prob,
            old_log_prob=old_log_prob[mb],
            advantages=advantages[mb],
            response_mask=mask,
            rollout_log_prob=None if rollout_log_prob is None else rollout_log_prob[mb],
            loss_agg_mode=mode,
            validate=False,  # validated once per rollout batch (`ppo_update`); log-probs of the model are <= 0
            **counts,
            **({} if ctx is None else {"batch_context": ctx}),
            **s.hparams,
        )
        if ref_log_prob is not None:  # k3 estimator of KL(pi || ref), clamped like veRL's low_var_kl
            kl_loss = agg_loss(kl_k3(ref_log_prob[mb] - log_prob, clamp=10.0), mask, mode, **counts)
            loss = loss + s.kl_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss.detach()
        if entropy is not None:
            loss = loss - s.entropy_coeff * agg_loss(entropy, mask, mode, **counts)
        (loss if scaler is None else scaler.scale(loss)).backward()
        mini_log_prob.append(log_prob.detach())  # (b, T)
        for key, value in metrics.items():  # losses normalised by the mini-batch add up; diagnostics average
            share = value if key in _ADDITIVE else value / len(micro)
            sums[key] = sums[key] + share if key in sums else share
    return torch.cat(mini_log_prob), sums


def mini_batch_diagnostics(
    sums: dict[str, Tensor],
    optimizer: torch.optim.Optimizer,
    params: list[Tensor],
    mini_lp: Tensor,
    mini_old: Tensor,
    mini_mask: Tensor,
    s: UpdateSettings,
    scaler: torch.amp.GradScaler | None,
) -> tuple[bool, bool]:
    """Clip the accumulated gradient to `grad_clip` and add the mini-batch's regime diagnostics to `sums`
    (`vespo.diagnostics`, the lab's definitions): `actor/grad_norm` (before clipping), `actor/grad_clipped` (1 when
    grad_clip cut the step; its mean over a rollout step is the clip fraction), `is/top1pct_w_share`, `is/kl_mu_pi`
    (k3 KL(mu || pi) per token, also target_kl's estimate), `is/log_w_std` (std of sequence log W over sequences),
    `actor/nonfinite_grad`, `actor/momentum_share` (share of the coming step from the current gradient, from the
    optimizer state before the step; nan for a skipped non-finite step) and, with target_kl, `actor/kl_stopped` (1
    where the KL stops the update). Returns (finite gradient, target_kl stop):
    the one host sync per optimizer step (a NaN step would poison the weights)."""
    if scaler is not None:
        scaler.unscale_(optimizer)  # clip and log the true gradient
    grad_norm = clip_gradient(params, s.grad_clip)  # before clipping
    sums["actor/grad_norm"] = grad_norm
    sums["actor/lr"] = torch.tensor(float(optimizer.param_groups[0]["lr"]))  # a Python float: no sync
    sums["actor/grad_clipped"] = diagnostics.clip_bound(grad_norm, s.grad_clip)  # mean: the clip fraction
    sums["is/top1pct_w_share"] = top_share(seq_log_ratio(mini_lp, mini_old, mini_mask.to(mini_lp.dtype)))
    drift = diagnostics.stale_drift(mini_lp, mini_old, mini_mask)
    sums["is/kl_mu_pi"], sums["is/log_w_std"] = drift["kl_mu_pi"], drift["log_w_std"]
    kl = drift["kl_mu_pi"]  # target_kl's estimate of KL(mu || pi) on this mini-batch
    stop_flag = kl > s.target_kl if s.target_kl is not None else torch.zeros_like(kl, dtype=torch.bool)
    finite, stop = torch.stack([torch.isfinite(grad_norm), stop_flag]).tolist()
    sums["actor/nonfinite_grad"] = torch.tensor(float(not finite))
    sums["actor/momentum_share"] = diagnostics.momentum_share(optimizer) if finite else grad_norm.new_tensor(math.nan)
    if s.target_kl is not None:
        sums["actor/target_kl_k3"], sums["actor/kl_stopped"] = kl, torch.tensor(float(stop))
    if scaler is not None and (stop or not finite):
        scaler.update()  # an overflow lowers the loss scale; the step itself is skipped
    return finite, stop


def clip_gradient(params: list[Tensor], max_norm: float) -> Tensor:
    """Clip the accumulated gradient to global norm `max_norm` (0: left as it is, the lab's option; the trainer's
    grad_clip is > 0); returns its norm before clipping."""
    if max_norm > 0:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    return torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    params: list[Tensor],
    finite: bool,
    *,
    step_scale: str,
    log_update_norm: bool,
    scaler: torch.amp.GradScaler | None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    step_inputs: tuple,
) -> dict[str, Tensor]:
    """The optimizer's step on the clipped gradient (skipped when not `finite`, as veRL does), the scheduler's, then
    the control `step_scale` moves the weights by s x that step (`vespo.step_control`; `actor/step_scale`, and
    `actor/step_ess` for VCPO's rule; `step_inputs` = the mini-batch's metrics so far, log pi, mu, the sampler's
    log-probs and mask). `actor/update_norm` (with `log_update_norm`): how far the weights actually moved (Adam can
    undo a gradient that phi shrank). The one step of the trainer's loops and of the lab (`lab_model.lab_step`)."""
    out: dict[str, Tensor] = {}
    keep = log_update_norm or step_scale != "none"
    before = [p.detach().clone() for p in params] if keep else None
    if finite:
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()
        if scheduler is not None:
            scheduler.step()
    if step_scale != "none" and finite:  # theta <- theta_old + s * (theta_opt - theta_old), s <= 1
        sums, mini_lp, mini_old, rollout_rows, mini_mask = step_inputs
        out |= step_control.step_scale(step_scale, mean_phi=sums.get(diagnostics.MEAN_PHI),
                                       log_w=sampler_log_w(mini_lp, mini_old, rollout_rows,
                                                           mini_mask.to(mini_lp.dtype)),
                                       valid=mini_mask.sum(-1) > 0)  # fmt: skip
        scale_step(params, before, out["actor/step_scale"])
    if log_update_norm:
        out["actor/update_norm"] = torch.stack(
            [(p.detach() - b).norm() for p, b in zip(params, before, strict=True)]
        ).norm()
    return out


def opob_log_weights(
    model,
    rollout: Rollout,
    rows: Tensor,
    old_log_prob: Tensor,
    rollout_log_prob: Tensor | None,
    s: UpdateSettings,
    on_policy: bool,
) -> Tensor:
    """log of VCPO's baseline weight of each row, log(||grad_theta sum_t r_t||^2 w^2), (M,): r_t = pi/mu per token (its
    per-trajectory gradient with A = 1, summed over tokens), w = pi/pi_sampler per sequence (`sampler_log_w`,
    unclipped). One forward and backward per sequence (`torch.autograd.grad`: the accumulated gradient is untouched),
    at the weights the mini-batch is trained at; `on_policy`: mu is this forward itself (W == 1)."""
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for row in rows.split(1):
        with autocast(model, s.autocast_dtype):
            lp, _ = response_log_probs(
                model, rollout.select(row), temperature=s.temperature, top_p=s.top_p, top_k=s.top_k
            )  # (1, T)
        old = lp.detach() if on_policy else old_log_prob[row]
        mask = rollout.response_mask[row].to(lp.dtype)
        score = row_sum(torch.exp(token_log_ratio(lp, old)), mask).sum()
        grads = [g for g in torch.autograd.grad(score, params, allow_unused=True) if g is not None]
        sq_norm = torch.stack([g.float().square().sum() for g in grads]).sum()
        rollout_row = None if rollout_log_prob is None else rollout_log_prob[row]
        log_w = sampler_log_w(lp.detach(), old, rollout_row, mask)[0]
        out.append(torch.log(sq_norm) + 2.0 * log_w)
    return torch.stack(out)


def _baseline_gap(rewards: Tensor, advantages: Tensor, s: UpdateSettings) -> Tensor:
    """Mean over groups of |b - mean R|: how far VCPO's baseline moved from GRPO's group mean (0-dim)."""
    r = rewards.double().view(-1, s.group_size)
    a = advantages.double().view(-1, s.group_size)
    std = r.std(-1, keepdim=True, unbiased=False)
    scale = torch.where((std > 1e-8) & s.norm_adv_by_std, std, torch.ones_like(std))
    baseline = (r - a * scale).mean(-1)  # A = (R - b) / s  =>  b = R - A s, the same for every row of the group
    return (baseline - r.mean(-1)).abs().mean().float()


def _gradient_probe(
    model,
    params: list[Tensor],
    rollout: Rollout,
    rows: Tensor,
    advantages: Tensor,
    old_log_prob: Tensor,
    rollout_log_prob: Tensor | None,
    s: UpdateSettings,
    ctx: BatchContext | None,
) -> dict[str, Tensor]:
    """`diagnostics.gradient_probe` on mini-batch `rows` under the current weights: the trained method's policy loss
    (its hparams, aggregation and batch context; no KL or entropy term) and each reference's at its own defaults, from
    one forward per micro-batch. A reference whose loss is the trained method's (same method, resolved hparams and
    aggregation) shares its gradient. The micro-batches run over the mini-batch's two halves of prompt groups in turn,
    so the trained method's split-half cosine (its noise ceiling, issue 53) costs no extra forward."""
    mask = rollout.response_mask[rows]
    counts = {"global_num_tokens": mask.sum().float(), "global_num_seqs": (mask.sum(-1) > 0).sum().float()}
    trained = (s.method, validate_hparams(s.method, **s.hparams), s.agg_mode)
    specs = {diagnostics.PROBE_METHOD: (s.method, s.hparams, s.agg_mode, ctx)}
    for name, (method, hparams) in diagnostics.PROBE_REFERENCES.items():
        mode = default_loss_agg_mode(method)
        if (method, validate_hparams(method, **hparams), mode) != trained:
            specs[name] = (method, hparams, mode, None)

    groups = rows.numel() // s.group_size
    cut = (groups // 2) * s.group_size if groups >= 2 else rows.numel() // 2
    halves = (rows[:cut], rows[cut:]) if 0 < cut < rows.numel() else (rows,)
    parts = [(h, mb) for h, half in enumerate(halves) for mb in micro_batches(half, s.micro_batch_size)]

    def losses():
        for _, mb in parts:
            with autocast(model, s.autocast_dtype):
                lp, _ = response_log_probs(model, rollout.select(mb), temperature=s.temperature, top_p=s.top_p,
                                           top_k=s.top_k)  # fmt: skip
            inputs = {"log_prob": lp, "old_log_prob": old_log_prob[mb], "advantages": advantages[mb],
                      "response_mask": rollout.response_mask[mb],
                      "rollout_log_prob": None if rollout_log_prob is None else rollout_log_prob[mb]}  # fmt: skip
            yield {
                name: compute_policy_loss(method, **inputs, loss_agg_mode=mode, **counts, validate=False,
                                          **({} if c is None else {"batch_context": c}), **hparams)[0]
                for name, (method, hparams, mode, c) in specs.items()
            }  # fmt: skip

    return diagnostics.gradient_probe(params, losses(), halves=[h for h, _ in parts] if len(halves) == 2 else None)


def _batch_context(
    model,
    rollout: Rollout,
    rows: Tensor,
    advantages: Tensor,
    old_log_prob: Tensor,
    rollout_lp: Tensor | None,
    s: UpdateSettings,
    k: int,
    n_micro: int,
    on_policy: bool = False,
) -> BatchContext | None:
    """Mini-batch statistics for the methods that declare `batch_context` (None for the others): the mini-batch index
    k, and with more than one micro-batch the whole mini-batch's log W from one extra no-grad forward, so that every
    micro-batch's controller decides exactly as one pass over the mini-batch would (`on_policy`: mu is not scored
    yet, and is that forward itself)."""
    if not uses_batch_context(s.method):
        return None
    if n_micro == 1:  # the call sees the whole mini-batch itself
        return BatchContext(mini_batch_index=k, num_mini_batches=s.num_mini_batches)
    with torch.no_grad():
        log_prob, _ = policy_log_probs(model, rollout, rows, **s.log_prob_args)
    rollout_rows = None if rollout_lp is None else rollout_lp[rows]
    return batch_context(
        PolicyBatch(
            log_prob,
            log_prob if on_policy else old_log_prob[rows],
            advantages[rows],
            rollout.response_mask[rows],
            rollout_rows,
        ),
        **{k: s.hparams[k] for k in CORRECTION_OPTIONS if k in s.hparams},
        mini_batch_index=k,
        num_mini_batches=s.num_mini_batches,
    )


def rollout_metrics(rewards: Tensor, rollout: Rollout, max_response_length: int) -> dict[str, Tensor]:
    """Reward, response length (mean, p90, share cut at `max_response_length`) and the sampler's entropy estimate."""
    mask = rollout.response_mask.bool()
    lengths = rollout.response_mask.sum(-1).float()
    out = {
        "reward/mean": rewards.mean(),
        "reward/std": rewards.std() if rewards.numel() > 1 else torch.zeros(()),
        "response/length_mean": lengths.mean(),
        "response/length_p90": torch.quantile(lengths, 0.9),
        "response/clip_frac": (lengths >= max_response_length).float().mean(),
        "actor/entropy": -rollout.rollout_log_prob[mask].mean(),  # MC estimate: mean -log pi of samples
    }
    return out


def mismatch_metrics(train_log_prob: Tensor, rollout: Rollout) -> dict[str, Tensor]:
    """The train-inference gap on the sampled tokens: the learner's log-probs under the weights the sampler used
    against the sampler's own (paper Sec. 4.6)."""
    gap = (train_log_prob - rollout.rollout_log_prob)[rollout.response_mask.bool()]  # log pi_train - log pi_rollout
    return {"mismatch/log_ratio_abs_mean": gap.abs().mean(), "mismatch/k3_kl": kl_k3(gap).mean()}


def _has_dropout(model) -> bool:
    """Whether any dropout of `model` is active (a train-mode forward then differs from the eval-mode one)."""
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


def summarize_update(history: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """The update's metrics over its mini-batches: the mean of each, plus the first and last mini-batch of the
    `PER_INDEX` keys (the first is on-policy, the last the stalest: their gap is the staleness), and the gradient
    probe's `probe/*` from the mini-batch that ran it."""
    trained = [h for h in history if not h.get("actor/kl_stopped", 0)]  # a target_kl stop trains nothing
    per_step = [key for key in trained[0] if not key.startswith(diagnostics.PROBE_PREFIX)] if trained else []
    out = {key: torch.stack([h[key] for h in trained]).float().mean() for key in per_step}
    out |= {key: v for h in trained for key, v in h.items() if key.startswith(diagnostics.PROBE_PREFIX)}
    out["actor/num_mini_batches"] = torch.tensor(float(len(trained)))
    if "actor/kl_stopped" in history[-1]:
        out["actor/kl_stopped"] = history[-1]["actor/kl_stopped"]
    for key in PER_INDEX:
        if trained and key in trained[0]:
            out[f"{key}/first_mini_batch"] = trained[0][key]
            out[f"{key}/last_mini_batch"] = trained[-1][key]
    return out


def to_floats(metrics: dict[str, Tensor | float]) -> dict[str, float]:
    """A logged step's metrics as Python floats: the tensors are stacked and copied to the host once."""
    keys = [k for k, v in metrics.items() if isinstance(v, Tensor)]
    out = {k: float(v) for k, v in metrics.items() if not isinstance(v, Tensor)}
    if keys:
        values = torch.stack([metrics[k].detach().float().reshape(()).cpu() for k in keys]).tolist()
        out |= dict(zip(keys, values, strict=True))
    return {k: out[k] for k in metrics}
