"""The learner: log-probs of a rollout under the policy and the N sequential mini-batch update (`ppo_update`, top to
bottom: score mu, then per mini-batch its gradient, clip, one host sync, the step). Every loop calls it with explicit
settings (`UpdateSettings`), never a run config. Beside it, each in its own module: VCPO's baseline (`train.opob`),
the gradient probe (`train.probe`) and the step's metrics (`train.step_metrics`: tensors until a step is logged)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

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
)
from vespo.rollout import Rollout, response_log_probs
from vespo.train import opob, step_metrics
from vespo.train.probe import gradient_probe
from vespo.train.step_metrics import mismatch_metrics, summarize_update

Tensor = torch.Tensor
_ADDITIVE = ("loss/pg", "actor/kl_loss")  # metrics that are micro-batch shares of a mini-batch total


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
        names = ("micro_batch_size", "temperature", "top_p", "top_k", "autocast_dtype")
        return {name: getattr(self, name) for name in names}

    @property
    def agg_mode(self) -> str:
        """The aggregation in use: `loss_agg_mode`, or the method's own default."""
        return self.loss_agg_mode or default_loss_agg_mode(self.method)


@dataclass(frozen=True)
class UpdateBatch:
    """What one update trains on: the rollout and its per-row inputs, B rows (`rollout.response_mask` (B, T))."""

    rollout: Rollout
    advantages: Tensor
    """(B,) or (B, T) advantages."""
    old_log_prob: Tensor | None = None
    """(B, T) mu, the log-probs the importance weights W = pi/mu are taken against; None: scored by `ppo_update` under
    the weights before its first step."""
    ref_log_prob: Tensor | None = None
    """(B, T) log-probs under the KL reference (with `kl_coef`)."""
    rollout_log_prob: Tensor | None = None
    """(B, T) the sampler's log-probs, entering the loss as its train-inference correction (None: no correction)."""
    rewards: Tensor | None = None
    """(B,) rewards, for `adv_estimator="opob"`."""


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
        """`settings.num_mini_batches` sequential optimizer steps on the rollout (`ppo_update`, the inputs as in
        `UpdateBatch`); the update's metrics summarised over its mini-batches, as tensors. `probe`: run the gradient
        probe on the stalest mini-batch. `old_log_prob` None: the rollout was sampled from the current weights, so mu
        is scored inside the update (TRL's on-policy shortcut: mini-batch 0's own forward is its mu, W == 1 exactly; a
        policy with active dropout is scored by a separate eval-mode forward instead), and the gap between mu and the
        sampler's log-probs is logged as `mismatch/*` (the train-inference mismatch, paper Sec. 4.6)."""
        scored = old_log_prob is None
        if scored and _has_dropout(self.model):
            old_log_prob = self.log_probs(rollout)
        batch = UpdateBatch(rollout, advantages, old_log_prob, ref_log_prob, rollout_log_prob, rewards)
        self.model.train()
        history, mu = ppo_update(self, batch, probe=probe)
        self.model.eval()
        return summarize_update(history) | (mismatch_metrics(mu, rollout) if scored else {})

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
            for mb in rows.split(micro_batch_size)  # micro-batches: consecutive chunks of rows
        ]
    logp = torch.cat([o[0] for o in outs])  # (len(rows), T)
    ent = torch.cat([o[1] for o in outs]) if with_entropy else None
    return logp, ent


def ppo_update(learner: Learner, batch: UpdateBatch, *, probe: bool = False) -> tuple[list[dict[str, Tensor]], Tensor]:
    """One optimizer step per mini-batch, in order (rows shuffled first with `settings.shuffle`); returns each
    mini-batch's metrics (0-dim tensors) and mu (B, T), the log-probs its importance weights were taken against.

    Mini-batch k (0-based) is trained after k updates of the weights mu was computed with, so its importance weights
    W = pi/mu are exactly 1 for k = 0 and drift from 1 afterwards (the staleness of Sec. 4.3). `batch.old_log_prob`
    None: mu is scored here under the weights before the first step, mini-batches 1..N-1 by one no-grad forward first,
    mini-batch 0 from its own forward. The batch is validated once here; the micro-batch calls skip validation.
    `probe`: the gradient probe (`vespo.train.probe`) on the last (stalest) mini-batch, before its step."""
    s, model, optimizer = learner.settings, learner.model, learner.optimizer
    rollout, n_rows, score_old = batch.rollout, batch.advantages.shape[0], batch.old_log_prob is None
    mu = torch.zeros_like(rollout.rollout_log_prob) if score_old else batch.old_log_prob  # (B, T)
    check_policy_inputs(log_prob=None, old_log_prob=mu, advantages=batch.advantages,
                        response_mask=rollout.response_mask, rollout_log_prob=batch.rollout_log_prob)  # fmt: skip
    order = torch.randperm(n_rows) if s.shuffle else torch.arange(n_rows)  # global RNG: checkpointed
    if s.adv_estimator == "opob":  # each mini-batch's rows get VCPO's baseline at its weights: a copy to overwrite
        opob.check_inputs(batch.rewards, s.shuffle)
        batch = replace(batch, advantages=batch.advantages.clone())
    params = [p for group in optimizer.param_groups for p in group["params"]]  # all weights, or the LoRA adapters
    if score_old and n_rows > s.seqs_per_mini_batch:  # the stale mini-batches' mu, before any step
        later = order[s.seqs_per_mini_batch :]
        with torch.no_grad():
            mu[later] = policy_log_probs(model, rollout, later, **s.log_prob_args)[0]
    batch = replace(batch, old_log_prob=mu)
    history = []
    for k in range(s.num_mini_batches):
        # 1. the mini-batch's rows; mini-batch 0's own forward gives its mu when scoring here
        rows = order[k * s.seqs_per_mini_batch : (k + 1) * s.seqs_per_mini_batch]
        on_policy = score_old and k == 0
        optimizer.zero_grad(set_to_none=True)
        sums: dict[str, Tensor] = {}
        if s.adv_estimator == "opob":  # VCPO's baseline at the weights this mini-batch is trained from
            sums["opob/baseline_gap"] = _opob_advantages(model, batch, rows, s, on_policy=on_policy)
        # 2. the policy loss's gradient, accumulated over micro-batches
        ctx = _batch_context(model, batch, rows, s, index=k, on_policy=on_policy)
        mini_lp, loss_metrics = accumulate_gradients(model, batch, rows, s, ctx=ctx, on_policy=on_policy,
                                                     scaler=learner.scaler)  # fmt: skip
        if on_policy:
            mu[rows] = mini_lp
        sums |= loss_metrics
        # 3. clip; the regime diagnostics; one host sync: a non-finite gradient is skipped, a KL past target_kl stops
        mini_old, mini_mask = mu[rows], rollout.response_mask[rows]
        finite, stop = _clip_and_check(learner, params, sums, mini_lp, mini_old, mini_mask)
        if probe and k == s.num_mini_batches - 1:  # off the hot path: one more forward, at the caller's stride
            sums |= _gradient_probe(model, params, batch, rows, s, ctx)
        if not stop:  # 4. the optimizer step (scaled by a step control)
            inputs = (sums, mini_lp, mini_old, _rows(batch.rollout_log_prob, rows), mini_mask)
            sums |= optimizer_step(optimizer, params, finite, step_scale=s.step_scale, scaler=learner.scaler,
                                   log_update_norm=s.log_update_norm, scheduler=learner.scheduler,
                                   step_inputs=inputs)  # fmt: skip
        history.append({key: v.detach() for key, v in sums.items()})
        if stop:  # PPO's early stop: this and the remaining (staler) mini-batches are not trained on
            optimizer.zero_grad(set_to_none=True)
            break
    return history, mu


def _rows(t: Tensor | None, rows: Tensor) -> Tensor | None:
    """`t[rows]`, or None for an absent input."""
    return None if t is None else t[rows]


def _forward(model, rollout: Rollout, rows: Tensor, s: UpdateSettings, *, with_entropy: bool = False):
    """(len(rows), T) log pi of `rows` (and their entropy) from one forward, under the sampling distribution and the
    autocast of `s`; autograd as in the caller's context."""
    with autocast(model, s.autocast_dtype):
        return response_log_probs(model, rollout.select(rows), temperature=s.temperature, top_p=s.top_p,
                                  top_k=s.top_k, with_entropy=with_entropy)  # fmt: skip


def _counts(mask: Tensor) -> dict[str, Tensor]:
    """A mini-batch's token and sequence counts: every micro-batch's loss is normalised by them (exact accumulation)."""
    return {"global_num_tokens": mask.sum().float(), "global_num_seqs": (mask.sum(-1) > 0).sum().float()}


def _loss_inputs(batch: UpdateBatch, rows: Tensor, log_prob: Tensor, *, on_policy: bool = False) -> dict:
    """The policy loss's tensor inputs for `rows` at log pi `log_prob` (`on_policy`: mu is log pi itself)."""
    return {
        "log_prob": log_prob,
        "old_log_prob": log_prob.detach() if on_policy else batch.old_log_prob[rows],
        "advantages": batch.advantages[rows],
        "response_mask": batch.rollout.response_mask[rows],
        "rollout_log_prob": _rows(batch.rollout_log_prob, rows),
    }


def accumulate_gradients(
    model, batch: UpdateBatch, rows: Tensor, s: UpdateSettings, *, ctx: BatchContext | None, on_policy: bool,
    scaler: torch.amp.GradScaler | None,
) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """Backward of mini-batch `rows`' loss, micro-batch by micro-batch: the method's policy loss (paper Eq. 9 for
    VESPO) plus `kl_coef` x the k3 KL to the reference minus `entropy_coeff` x the entropy, each normalised by the
    whole mini-batch's token/sequence count, so accumulating them equals one big batch. `on_policy`: each
    micro-batch's own log pi is its mu. Returns the detached log pi (M, T) in `rows` order and the loss metrics
    (losses add up over micro-batches, diagnostics average)."""
    mode, counts = s.agg_mode, _counts(batch.rollout.response_mask[rows])
    micro = rows.split(s.micro_batch_size)  # consecutive chunks of rows (gradient accumulation)
    sums: dict[str, Tensor] = {}
    mini_log_prob = []
    for mb in micro:
        log_prob, entropy = _forward(model, batch.rollout, mb, s, with_entropy=s.entropy_coeff > 0)  # (b, T)
        inputs = _loss_inputs(batch, mb, log_prob, on_policy=on_policy)
        mask = inputs["response_mask"]  # (b, T)
        loss, metrics = compute_policy_loss(
            s.method, **inputs, loss_agg_mode=mode,
            validate=False,  # validated once per rollout batch (`ppo_update`); log-probs of the model are <= 0
            **counts, **({} if ctx is None else {"batch_context": ctx}), **s.hparams,
        )  # fmt: skip
        if batch.ref_log_prob is not None:  # k3 estimator of KL(pi || ref), clamped like veRL's low_var_kl
            kl_loss = agg_loss(kl_k3(batch.ref_log_prob[mb] - log_prob, clamp=10.0), mask, mode, **counts)
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


def _clip_and_check(
    learner: Learner, params: list[Tensor], sums: dict[str, Tensor], log_prob: Tensor, old_log_prob: Tensor,
    mask: Tensor,
) -> tuple[bool, bool]:  # fmt: skip
    """Clip the accumulated gradient to `grad_clip`, add the mini-batch's diagnostics to `sums`
    (`step_metrics.mini_batch_metrics`, `step_outcome`), and return (finite gradient, target_kl stop): the one host
    sync per optimizer step (a NaN step would poison the weights; a non-finite one is skipped, as veRL does)."""
    s, optimizer, scaler = learner.settings, learner.optimizer, learner.scaler
    if scaler is not None:
        scaler.unscale_(optimizer)  # clip and log the true gradient
    grad_norm = clip_gradient(params, s.grad_clip)  # before clipping
    lr = optimizer.param_groups[0]["lr"]
    sums |= step_metrics.mini_batch_metrics(grad_norm, log_prob, old_log_prob, mask, grad_clip=s.grad_clip, lr=lr)
    kl = sums["is/kl_mu_pi"]  # target_kl's estimate of KL(mu || pi) on this mini-batch
    stop_flag = kl > s.target_kl if s.target_kl is not None else torch.zeros_like(kl, dtype=torch.bool)
    finite, stop = torch.stack([torch.isfinite(grad_norm), stop_flag]).tolist()
    sums |= step_metrics.step_outcome(optimizer, grad_norm, finite=finite, stop=stop, kl=kl, target_kl=s.target_kl)
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
                                       log_w=step_control.sampler_log_w(mini_lp, mini_old, rollout_rows,
                                                           mini_mask.to(mini_lp.dtype)),
                                       valid=mini_mask.sum(-1) > 0)  # fmt: skip
        step_control.scale_step(params, before, out["actor/step_scale"])
    if log_update_norm:
        out["actor/update_norm"] = torch.stack(
            [(p.detach() - b).norm() for p, b in zip(params, before, strict=True)]
        ).norm()
    return out


def _opob_advantages(model, batch: UpdateBatch, rows: Tensor, s: UpdateSettings, *, on_policy: bool) -> Tensor:
    """VCPO's baseline at the weights mini-batch `rows` is trained from (`vespo.train.opob`, one backward per
    sequence): its advantages are overwritten in `batch` (`ppo_update`'s copy); returns `opob/baseline_gap`."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    old = None if on_policy else batch.old_log_prob
    log_v = opob.opob_log_weights(lambda row: _forward(model, batch.rollout, row, s)[0], trainable, rows,
                                  old_log_prob=old, rollout_log_prob=batch.rollout_log_prob,
                                  response_mask=batch.rollout.response_mask)  # fmt: skip
    rewards = batch.rewards[rows]
    batch.advantages[rows] = opob_advantages(rewards, s.group_size, log_v, norm_by_std=s.norm_adv_by_std)
    return opob.baseline_gap(rewards, batch.advantages[rows], s.group_size, s.norm_adv_by_std)


def _gradient_probe(
    model, params: list[Tensor], batch: UpdateBatch, rows: Tensor, s: UpdateSettings, ctx: BatchContext | None
) -> dict[str, Tensor]:
    """`vespo.train.probe.gradient_probe` on mini-batch `rows` under the current weights: the trained method's loss
    with its hparams, aggregation and batch context, each micro-batch's inputs from one forward."""
    counts = _counts(batch.rollout.response_mask[rows])

    def loss_inputs(mb: Tensor) -> dict:
        return _loss_inputs(batch, mb, _forward(model, batch.rollout, mb, s)[0]) | counts

    trained = (s.method, s.hparams, s.agg_mode, ctx)
    return gradient_probe(params, rows, loss_inputs, trained=trained, group_size=s.group_size,
                          micro_batch_size=s.micro_batch_size)  # fmt: skip


def _batch_context(
    model, batch: UpdateBatch, rows: Tensor, s: UpdateSettings, *, index: int, on_policy: bool
) -> BatchContext | None:
    """Mini-batch statistics for the methods that declare `batch_context` (None for the others): the mini-batch
    `index` k, and with more than one micro-batch the whole mini-batch's log W from one extra no-grad forward, so that
    every micro-batch's controller decides exactly as one pass over the mini-batch would (`on_policy`: mu is not
    scored yet, and is that forward itself)."""
    if not uses_batch_context(s.method):
        return None
    if len(rows.split(s.micro_batch_size)) == 1:  # the call sees the whole mini-batch itself
        return BatchContext(mini_batch_index=index, num_mini_batches=s.num_mini_batches)
    with torch.no_grad():
        log_prob, _ = policy_log_probs(model, batch.rollout, rows, **s.log_prob_args)
    inputs = _loss_inputs(batch, rows, log_prob, on_policy=on_policy)
    corrections = {k: s.hparams[k] for k in CORRECTION_OPTIONS if k in s.hparams}
    return batch_context(PolicyBatch(**inputs), **corrections, mini_batch_index=index,
                         num_mini_batches=s.num_mini_batches)  # fmt: skip


def _has_dropout(model) -> bool:
    """Whether any dropout of `model` is active (a train-mode forward then differs from the eval-mode one)."""
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())
