"""Regime diagnostics: where a run sits relative to the paper's regime, one definition for every loop.

The learner (`vespo.train.learner.ppo_update`, logged to metrics.jsonl) and the lab
(`vespo.experiments.lab_model.lab_step`) both call these functions; the sweep, lab and `vespo compare` tables print
them beside accuracy. Pure tensor functions: tensors in, 0-dim tensors out, no host sync, no I/O.

- `clip_bound` / `clip_fraction`: whether `grad_clip` cut an optimizer step (pre-clip norm > max norm), and the share
  of steps it cut (the paper's runs clip at 1.0 and rarely bind).
- `stale_drift`: the per-token k3 estimate of KL(mu || pi) and the std over sequences of log W, meant for the
  stalest mini-batch (the last of a rollout step).
- `MEAN_PHI`: the loss metric holding the mean VESPO weight phi(W) of a mini-batch (computed by the losses).
- `momentum_parts` / `momentum_share`: how much of an optimizer step comes from the current gradient rather than
  from the optimizer's momentum state.
- `gradient_probe` / `compare_gradients`: on one (stale) mini-batch and the same weights, how far the trained
  method's gradient is from GRPO's and from plain REINFORCE's (cosine, relative norm of the difference): whether a
  comparison of methods can discriminate at all. The learner runs it at a stride (`probe_every`), off the hot path.

ESS and top-share are not here: they are the losses' own (`vespo.kernels.effective_sample_size`,
`vespo.losses.core.top_share`), and both loops call those.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

from vespo.losses.core import kl_k3, row_sum

Tensor = torch.Tensor

MEAN_PHI = "vespo/Z"
"""Loss metric of the VESPO family (vespo and the adaptive variants): mean phi(W) over the mini-batch's valid
sequences. Other methods do not report it; `mean_phi` then gives nan."""


def clip_bound(grad_norm: Tensor, max_norm: float) -> Tensor:
    """1.0 when gradient clipping cut this optimizer step, else 0.0 (0-dim float).

    Clipping binds when the pre-clip global gradient norm exceeds `max_norm` strictly (torch's clip_grad_norm_
    scales by max_norm / (norm + 1e-6), so a norm equal to the bound is left as it is); `max_norm <= 0` means
    clipping is off and never binds."""
    if max_norm <= 0:
        return torch.zeros((), device=grad_norm.device)
    return (grad_norm > max_norm).float()


def clip_fraction(bound: Sequence[Tensor] | Tensor) -> Tensor:
    """Share of optimizer steps that gradient clipping cut: the mean of their `clip_bound` flags (0-dim)."""
    flags = bound if isinstance(bound, Tensor) else torch.stack(list(bound))
    return flags.float().mean()


def stale_drift(log_prob: Tensor, old_log_prob: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """How far pi has drifted from mu on one mini-batch (call it on the stalest one), 0-dim tensors:

    - `kl_mu_pi`: KL(mu || pi) per token, the k3 estimate mean_t [exp(x_t) - 1 - x_t] with x_t = log pi - log mu
      over the valid tokens (samples of mu; >= 0, unbiased, low variance; Schulman 2020). The learner's target_kl
      stop uses this number.
    - `log_w_std`: the std over valid sequences (population std, ddof 0: 0 for one sequence) of the sequence
      log W = sum_t x_t.

    Shapes: `log_prob`, `old_log_prob`, `mask` (B, T). The ratios are exact: the losses' +-20 per-token guard is not
    applied, because it binds precisely in the regime this diagnoses (in the lab's T = 256, N = 64 VESPO cell
    38,111 sampled tokens were beyond it). k3 overflows float32 only past x = 88, i.e. mu(y_t) < 1e-38.
    """
    m = mask.to(log_prob.dtype)
    x = torch.where(m > 0, log_prob - old_log_prob, torch.zeros_like(log_prob))  # (B, T); padding -> 0
    kl = (kl_k3(x) * m).sum() / m.sum().clamp(min=1.0)
    log_w = row_sum(x, m)  # (B,): seq_log_ratio(log_prob, old_log_prob, m, clamp_tokens=False), padding zeroed
    valid = (m.sum(-1) > 0).to(log_prob.dtype)
    n = valid.sum().clamp(min=1.0)
    centred = (log_w - (log_w * valid).sum() / n) * valid
    return {"kl_mu_pi": kl, "log_w_std": (centred.square().sum() / n).sqrt()}


def mean_phi(loss_metrics: dict[str, Tensor]) -> Tensor:
    """Mean VESPO weight phi(W) of a mini-batch, from the metrics `compute_policy_loss` returned (`MEAN_PHI`); nan
    for methods without phi."""
    value = loss_metrics.get(MEAN_PHI)
    return torch.tensor(math.nan) if value is None else value.detach()


def momentum_parts(optimizer: torch.optim.Optimizer) -> tuple[Tensor, Tensor]:
    """(||u_g||, ||u_m||): the global norms of the parts of the coming optimizer step that come from the current
    gradient (u_g) and from the momentum state (u_m). Call it after the gradients are final (clipped, unscaled) and
    before `optimizer.step()`; nothing is modified.

    Adam / AdamW (torch's update, amsgrad included): with g the gradient, t the coming step, m, v the moments before
    it (0 when the state is empty),

        m_t = b1 m + (1 - b1) g,   v_t = b2 v + (1 - b2) g^2,
        step = -D * m_t,   D = lr / (1 - b1^t) / (sqrt(v_t / (1 - b2^t)) + eps)    (elementwise, D > 0),

    and since D multiplies both terms of m_t alike, step = u_g + u_m exactly, with u_g = -D (1 - b1) g and
    u_m = -D b1 m. AdamW's decoupled weight decay (theta *= 1 - lr wd) belongs to neither and is left out; Adam's
    coupled decay is part of the gradient (g + wd theta), as torch applies it.

    SGD: momentum 0 (or the first step, whose buffer is g itself) gives u_m = 0; otherwise buf_t = mu buf +
    (1 - dampening) g and the step is lr buf_t (u_g = lr (1 - d) g, u_m = lr mu buf), or with Nesterov
    lr (g + mu buf_t) (u_g = lr (1 + mu (1 - d)) g, u_m = lr mu^2 buf).

    Other optimizers: (nan, nan). Costs one pass over the parameters, like the optimizer step itself.
    """
    adam = isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW))
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    device = grads[0].device if grads else torch.device("cpu")
    if not adam and not isinstance(optimizer, torch.optim.SGD):
        nan = torch.full((), math.nan, device=device)
        return nan, nan
    sq_g: list[Tensor] = []
    sq_m: list[Tensor] = []
    for group in optimizer.param_groups:
        g_parts, m_parts = _group_squares(optimizer, group, adam)
        sq_g += g_parts
        sq_m += m_parts

    def norm(parts: list[Tensor]) -> Tensor:
        return torch.stack([x.to(device) for x in parts]).sum().sqrt() if parts else torch.zeros((), device=device)

    return norm(sq_g), norm(sq_m)


def _group_squares(optimizer: torch.optim.Optimizer, group: dict, adam: bool) -> tuple[list[Tensor], list[Tensor]]:
    """The squared norms of u_g and u_m of one parameter group (`momentum_parts`), summed per parameter for SGD and
    per bucket of parameters for Adam (`_adam_parts`)."""
    sq_g: list[Tensor] = []
    sq_m: list[Tensor] = []
    lr, wd = group["lr"], group.get("weight_decay", 0.0)
    decoupled = isinstance(optimizer, torch.optim.AdamW) or group.get("decoupled_weight_decay", False)
    adam_items = []  # (g, m, v, v_max, step) per parameter of this group
    for p in group["params"]:
        if p.grad is None:
            continue
        g = p.grad.detach()
        g = g.float() if g.dtype in (torch.float16, torch.bfloat16) else g  # norms of low-precision weights in fp32
        state = optimizer.state.get(p, {})
        if wd and not (adam and decoupled):
            g = g + wd * p.detach()  # coupled L2 decay: part of the gradient the optimizer sees
        if adam:
            v_max = state.get("max_exp_avg_sq") if group.get("amsgrad") else None
            step = state.get("step", torch.zeros((), device=g.device))
            adam_items.append((g, state.get("exp_avg"), state.get("exp_avg_sq"), v_max, step))
            continue
        mu, damp = group.get("momentum", 0.0), group.get("dampening", 0.0)
        buf = state.get("momentum_buffer")
        if mu == 0 or buf is None:
            sq_g.append((lr * g).square().sum())
        elif group.get("nesterov"):
            sq_g.append((lr * (1 + mu * (1 - damp)) * g).square().sum())
            sq_m.append((lr * mu * mu * buf).square().sum())
        else:
            sq_g.append((lr * (1 - damp) * g).square().sum())
            sq_m.append((lr * mu * buf).square().sum())
    if adam_items:
        (b1, b2), eps = group["betas"], group["eps"]
        t = torch.stack([x[4].to(adam_items[0][0].device) for x in adam_items]).to(torch.float64) + 1  # no sync
        c = lr / (1 - b1**t)  # per parameter: D = c / (sqrt(v_t) / sqrt(1 - b2^t) + eps), t the coming step
        sg, sm = _adam_parts(adam_items, c, (1 - b2**t).sqrt(), b2, eps)
        sq_g.append((1 - b1) ** 2 * sg)
        if b1 != 0:
            sq_m.append(b1**2 * sm)
    return sq_g, sq_m


_BUCKET = 1 << 20
"""Elements per bucket in `_adam_parts`: small parameters share one bucket (few kernels for a model of many small
tensors), large ones are cut into slices (temporaries of a few MiB whatever a parameter's size)."""


def _adam_parts(items: list[tuple], c: Tensor, bias2: Tensor, b2: float, eps: float) -> tuple[Tensor, Tensor]:
    """(sum (D g)^2, sum (D m)^2) over one parameter group, D = c / (sqrt(v_t) / bias2 + eps) Adam's elementwise
    step factor (c, bias2: (P,) per parameter) with v_t = b2 v + (1 - b2) g^2 (its amsgrad maximum if kept); a missing
    m or v is 0 (empty state).
    Computed over buckets of at most `_BUCKET` elements, parameters concatenated or sliced to fill them."""
    sg = sm = items[0][0].new_zeros((), dtype=torch.float64)
    bucket: list[tuple[int, int, int]] = []  # (item, start, stop) slices of flattened parameters
    size = 0

    def flush() -> None:
        nonlocal sg, sm
        counts = [stop - start for _, start, stop in bucket]
        f64 = any(items[i][0].dtype == torch.float64 for i, _, _ in bucket)
        dtype = torch.float64 if f64 else torch.float32  # fp16 / bf16 state in fp32

        def cat(k: int) -> Tensor:
            parts = []
            for i, start, stop in bucket:
                x = items[i][k]
                parts.append(items[i][0].new_zeros(stop - start) if x is None else x.detach().reshape(-1)[start:stop])
            return torch.cat([x.to(dtype) for x in parts])

        def per_element(values: Tensor) -> Tensor:  # a per-parameter factor, repeated over the parameter's slice
            factors = values[[i for i, _, _ in bucket]].to(dtype)
            return factors.repeat_interleave(torch.tensor(counts, device=factors.device), output_size=sum(counts))

        g = cat(0)
        d = g.square().mul_(1 - b2).add_(cat(2), alpha=b2)  # v_t
        if any(items[i][3] is not None for i, _, _ in bucket):
            torch.maximum(d, cat(3), out=d)
        d.sqrt_().div_(per_element(bias2)).add_(eps).reciprocal_().mul_(per_element(c))  # D
        sg = sg + g.mul_(d).square_().sum()  # torch's cascade sum: BLAS dot loses ~1e-4 over a million terms
        sm = sm + cat(1).mul_(d).square_().sum()

    for i, item in enumerate(items):
        n = item[0].numel()
        for start in range(0, n, _BUCKET):
            stop = min(n, start + _BUCKET)
            if size + stop - start > _BUCKET:
                flush()
                bucket, size = [], 0
            bucket.append((i, start, stop))
            size += stop - start
    if bucket:
        flush()
    return sg, sm


def momentum_share(optimizer: torch.optim.Optimizer) -> Tensor:
    """Share of the coming optimizer step that comes from the current gradient rather than from optimizer state:
    ||u_g|| / (||u_g|| + ||u_m||) with the exact decomposition step = u_g + u_m of `momentum_parts` (0-dim, in
    [0, 1]). Call it after clipping and before `optimizer.step()`.

    1 when beta1 = 0 (or SGD without momentum) and on the first step (empty state: m = 0); 1 - beta1 in the steady
    state of a constant gradient (m -> g), 0.1 for Adam's 0.9; near 0 when the current gradient is tiny next to the
    momentum, i.e. the step is the echo of earlier gradients. No gradient and no momentum (nothing moves): 1, never
    nan. nan for optimizers other than Adam, AdamW and SGD.
    """
    a, b = momentum_parts(optimizer)
    total = a + b
    return torch.where(total == 0, 1.0, a / total)  # nan stays nan (an optimizer without a definition)


PROBE_REFERENCES: dict[str, tuple[str, dict]] = {"grpo": ("grpo", {}), "reinforce": ("reinforce", {})}
"""The gradients `gradient_probe` compares a method's with: name -> (registered method, hparams), each at its own
defaults and its own aggregation: GRPO with DAPO's bounds (0.2, 0.28, token-mean) and plain REINFORCE (-A log pi, no
importance weight: the direction every IS-weighted method reshapes)."""
PROBE_METHOD = "method"
"""`gradient_probe`'s name for the trained method's loss."""
PROBE_PREFIX = "probe/"
"""Metric prefix of the gradient probe: `probe/cos_<ref>`, `probe/rel_diff_<ref>` (the trained method against each
reference), `probe/cos_grpo_reinforce` (the two references against each other) and `probe/cos_split_half` (the
trained method against itself on the mini-batch's two halves: the ceiling of the other cosines)."""


def gradient_probe(
    params: Sequence[Tensor], losses: Iterable[dict[str, Tensor]], halves: Sequence[int] | None = None
) -> dict[str, Tensor]:
    """The probe's metrics (`PROBE_PREFIX`, 0-dim float64 tensors, no host sync) from the policy losses of several
    methods on one mini-batch under the same weights.

    `losses` yields, per micro-batch, {name: scalar loss} with the names `PROBE_METHOD` (the trained method) and
    those of `PROBE_REFERENCES` (a reference may be absent where its loss is the trained method's: it then shares that
    gradient exactly), each normalised by the whole mini-batch, so the micro-batch gradients add up to the
    mini-batch's. Gradients are taken with `torch.autograd.grad`: the parameters' `.grad` (the training step's) is
    left as it is. `halves` (0 or 1 per micro-batch): which half of the mini-batch each micro-batch is; with it,
    `cos_split_half` is the trained method's cosine between its gradients on the two halves: the noise ceiling of
    the cross-method cosines (how far below 1 the same loss lands on other samples of the same batch)."""
    params = [p for p in params if p.requires_grad]
    total: dict[str, Tensor] = {}
    for k, micro in enumerate(losses):
        names = list(micro)
        for i, name in enumerate(names):
            grads = torch.autograd.grad(micro[name], params, retain_graph=i < len(names) - 1, allow_unused=True)
            flat = torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1).double()
                              for p, g in zip(params, grads, strict=True)])  # fmt: skip
            keys = [name] + ([f"{name}@{halves[k]}"] if halves is not None and name == PROBE_METHOD else [])
            for key in keys:
                total[key] = total[key] + flat if key in total else flat
    total |= {ref: total[PROBE_METHOD] for ref in PROBE_REFERENCES if ref not in total}  # the trained method's loss
    out = {}
    for ref in PROBE_REFERENCES:
        cos, rel = compare_gradients(total[PROBE_METHOD], total[ref])
        out[f"{PROBE_PREFIX}cos_{ref}"], out[f"{PROBE_PREFIX}rel_diff_{ref}"] = cos, rel
    out[f"{PROBE_PREFIX}cos_grpo_reinforce"] = compare_gradients(total["grpo"], total["reinforce"])[0]
    if halves is not None:
        halves_of = (total[f"{PROBE_METHOD}@0"], total[f"{PROBE_METHOD}@1"])
        out[f"{PROBE_PREFIX}cos_split_half"] = compare_gradients(*halves_of)[0]
    return out


def compare_gradients(g: Tensor, ref: Tensor) -> tuple[Tensor, Tensor]:
    """(cosine between g and ref, ||g - ref|| / ||ref||), 0-dim float64, for flat gradients of one model.

    The cosine is g.ref / sqrt(||g||^2 ||ref||^2), so g == ref gives exactly 1 (sqrt of an exact square is exact),
    clamped to [-1, 1]; nan when either gradient is 0 (no direction: e.g. every advantage of the batch is 0). The
    relative difference is 0 for equal gradients, inf when ref is 0 and g is not, nan when both are 0."""
    g, ref = g.double(), ref.double()
    gg, rr, gr = (g * g).sum(), (ref * ref).sum(), (g * ref).sum()
    denom = (gg * rr).sqrt()
    cos = (gr / denom).clamp(-1.0, 1.0)  # 0 / 0 = nan for a zero gradient
    return cos, (g - ref).square().sum().sqrt() / rr.sqrt()
