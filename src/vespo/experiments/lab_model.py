"""Lab v2 (`vespo lab --preset v2`): a shared-parameter autoregressive chain policy that stale training can break.

The v1 lab (independent logits per position, one reward-relevant token) cannot collapse: every estimator with
non-negative weights pushes the right way there. v2 keeps the exact log-probs and the speed but shares parameters
across contexts, as a language model does:

    logit(y | prev, t) = b[y] + E[prev] . U[y]            for y != EOS
    logit(EOS | prev, t) = b[EOS] + E[prev] . U[EOS] + g(t)

with a vocabulary of V tokens (id 0 = EOS), a rank-d bilinear term shared by every context, a Zipf-like bias b (so
the initial distribution of wrong tokens is Zipf), and a position term g(t) on EOS (hat functions over [0, T]), so
length is sampled, varies, and is learned. The correct token after `prev` is `answer[prev]` (a fixed random map
to non-EOS tokens): pushing a token down where it is wrong moves b and U, which it shares with the contexts where it is
right. A response is the tokens up to its first EOS; one with no EOS within T is truncated. Reward (`reward`): by
default graded, R = the share of correct tokens of a response that ended with EOS and has at least T/4 tokens, else
0, so on-policy training does not saturate it; "threshold" (lab v2's published reward) is
R = 1[the response ended with EOS, has at least T/4 tokens, and a share >= q of them is correct], q set so that
about a quarter of the initial policy's responses succeed. Length is a real trade-off: below q, shorter responses
succeed more often (more variance), above it longer ones (less), and a truncated one fails.
E[R] has no tractable closed form here (the count couples all positions), so it is
estimated on a fixed evaluation sample (`eval_samples` sequences, the same random numbers at every evaluation:
common random numbers make differences across steps and methods low-variance; the standard error of one estimate is
at most 0.5 / sqrt(eval_samples)).

Log-probs are one (V+1, V) table per step and a gather: a mini-batch at T = 1024 costs milliseconds, exactly, and
the tests check them against a direct per-token softmax. Sampling loops over positions, batched over sequences, by
a binary search in one flattened CDF of all contexts (no per-step (B, V) work).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from vespo import diagnostics
from vespo.advantages import group_advantages
from vespo.experiments.lab_config import ChainSpec, LabConfig
from vespo.kernels import effective_sample_size
from vespo.losses import BatchContext, compute_policy_loss, uses_batch_context
from vespo.losses.core import seq_log_ratio, top_share
from vespo.train.learner import clip_gradient, optimizer_step

Tensor = torch.Tensor
EOS = 0


class ChainPolicy:
    """The v2 policy: parameters (b, E, U, g) as leaf tensors; exact log-probs, batched sampling, the reward."""

    def __init__(self, spec: ChainSpec, length: int, *, seed: int):
        if spec.vocab < 16 or spec.rank < 1 or length < 2:
            raise ValueError(f"need vocab >= 16, rank >= 1 and length >= 2, got {spec.vocab}, {spec.rank}, {length}")
        self.spec, self.length = spec, length
        v, d = spec.vocab, spec.rank
        gen = torch.Generator().manual_seed(seed)
        f64 = torch.float64
        # the correct token after each context (prev in 0..V, V = BOS): a random non-EOS token
        self.answer = 1 + torch.randint(0, v - 1, (v + 1,), generator=gen)  # (V+1,)
        # Zipf prior over the non-EOS tokens, in a random rank order; EOS gets probability 1/(mean length) per token
        ranks = 1 + torch.randperm(v - 1, generator=gen).to(f64)
        bias = torch.empty(v, dtype=f64)
        bias[1:] = -spec.zipf * ranks.log()
        bias[1:] -= torch.logsumexp(bias[1:], 0)
        u = torch.randn(v, d, generator=gen, dtype=f64) / math.sqrt(d)  # (V, d), rows of norm ~1
        u[EOS] = 0.0
        # E[prev] . U[answer] = beta(prev) sets the correct token's log-odds against the Zipf mass (which is 1)
        beta = math.log(spec.p_correct / (1 - spec.p_correct)) - bias[self.answer]  # (V+1,)
        emb = beta[:, None] * u[self.answer] / u[self.answer].square().sum(-1, keepdim=True)  # (V+1, d)
        p_eos = 1.0 / max(2.0, spec.mean_length * length)
        bias[EOS] = math.log(p_eos / (1 - p_eos))  # against the non-EOS log-partition, which is ~0 (below)
        self.params = {
            "bias": bias.requires_grad_(),
            "emb": emb.requires_grad_(),
            "out": u.requires_grad_(),
            "eos_pos": torch.zeros(spec.knots, dtype=f64, requires_grad=True),
        }
        # hat-function basis of g(t) over positions 0..T-1: (T, knots)
        pos = torch.linspace(0, spec.knots - 1, length, dtype=f64)
        self.basis = (1 - (pos[:, None] - torch.arange(spec.knots, dtype=f64)).abs()).clamp_min(0)
        # center the initial non-EOS log-partition of each context at 0 so p_eos is as stated
        with torch.no_grad():
            z_rest = self._tables()[1]
            self.params["bias"][EOS] += z_rest.mean()

    # ---------------------------------------------------------------------------------------------------------------
    # exact log-probs

    def _tables(self) -> tuple[Tensor, Tensor, Tensor]:
        """(logits (V+1, V) without the position term, log-partition of the non-EOS tokens (V+1,), g (T,))."""
        p = self.params
        logits = p["emb"] @ p["out"].T + p["bias"]  # (V+1, V)
        z_rest = torch.logsumexp(logits[:, 1:], -1)  # (V+1,)
        return logits, z_rest, self.basis @ p["eos_pos"]

    @staticmethod
    def previous(tokens: Tensor, bos: int) -> Tensor:
        """The context of each position: the previous token, BOS (= V) at t = 0. (B, T)."""
        return torch.cat([torch.full_like(tokens[:, :1], bos), tokens[:, :-1]], 1)

    def log_probs(self, tokens: Tensor) -> Tensor:
        """Exact log pi(y_t | y_{t-1}, t) of every token: (B, T) -> (B, T), differentiable in the parameters."""
        logits, z_rest, g = self._tables()
        prev = self.previous(tokens, self.spec.vocab)
        eos_logit = logits[prev, EOS] + g[: tokens.shape[1]]  # (B, T)
        log_z = torch.logaddexp(z_rest[prev], eos_logit)  # (B, T)
        chosen = torch.where(tokens == EOS, eos_logit, logits[prev, tokens])
        return chosen - log_z

    # ---------------------------------------------------------------------------------------------------------------
    # sampling and reward

    @torch.no_grad()
    def sample(self, count: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        """`count` responses: tokens (count, T) int64 (anything after the first EOS is padding) and the response mask
        (count, T): 1 up to and including the first EOS, every position of a truncated response.

        Per position, batched over responses: EOS when logit(u) - g(t) < logit(EOS | prev) - log Z_rest(prev), else a
        binary search of prev + u' in the flattened CDF of all contexts (row r lies in (r, r + 1]), with the queries
        sorted (cache-friendly). The loop runs in numpy, whose per-call overhead is a few microseconds: this loop
        is the lab's main cost."""
        logits, z_rest, g = self._tables()
        v, t_max = self.spec.vocab, self.length
        eos_margin = (logits[:, EOS] - z_rest).numpy()  # (V+1,)
        cdf = torch.softmax(logits[:, 1:], -1).cumsum(-1)  # (V+1, V-1) non-EOS tokens given no EOS
        cdf[:, -1] = 1.0
        flat = (cdf + torch.arange(v + 1, dtype=cdf.dtype)[:, None]).reshape(-1).numpy()
        token_of = (torch.arange(flat.size) % (v - 1) + 1).numpy()  # flat index -> token id
        u = torch.rand(2, t_max, count, generator=gen, dtype=torch.float64)
        eos_draw = (torch.logit(u[0]) - g[:, None]).numpy()  # (T, B)
        tok_draw = (1.0 - u[1]).numpy()  # (T, B) in (0, 1]: prev + u stays inside row prev
        tokens = np.empty((t_max, count), dtype=np.int64)
        prev = np.full(count, v, dtype=np.int64)
        for t in range(t_max):
            query = prev + tok_draw[t]
            order = np.argsort(query)
            tok = np.empty(count, dtype=np.int64)
            tok[order] = token_of[np.searchsorted(flat, query[order])]
            prev = np.where(eos_draw[t] < eos_margin[prev], EOS, tok)
            tokens[t] = prev
        tokens = torch.from_numpy(tokens.T.copy())
        return tokens, self.response_mask(tokens)

    @staticmethod
    def response_mask(tokens: Tensor) -> Tensor:
        """1 up to and including the first EOS (all of a response with none): (B, T) float64."""
        eos_before = (tokens == EOS).cumsum(1) - (tokens == EOS).long()  # EOS strictly before t
        return (eos_before == 0).to(torch.float64)

    def correct_counts(self, tokens: Tensor, mask: Tensor) -> Tensor:
        """Correct tokens per response: y_t == answer[y_{t-1}] inside the response. (B,)."""
        prev = self.previous(tokens, self.spec.vocab)
        return ((tokens == self.answer[prev]) & (mask > 0)).sum(-1)

    @staticmethod
    def ended(tokens: Tensor) -> Tensor:
        """Whether each response ended with EOS within T (not truncated). (B,) bool."""
        return (tokens == EOS).any(-1)

    def accuracy(self, tokens: Tensor, mask: Tensor) -> Tensor:
        """Share of correct tokens among a response's content tokens (EOS excluded); 0 for an empty one. (B,)."""
        content = mask.sum(-1) - self.ended(tokens).to(mask.dtype)
        return self.correct_counts(tokens, mask) / content.clamp_min(1)

    def eligible(self, tokens: Tensor, mask: Tensor) -> Tensor:
        """Whether a response can be graded: it ended with EOS and has at least `min_length` x T tokens. (B,)."""
        return self.ended(tokens) & (mask.sum(-1) >= self.spec.min_length * self.length)

    def rewards(self, tokens: Tensor, mask: Tensor, threshold: float) -> Tensor:
        """(B,) float64. `spec.reward` "threshold": R = 1[ended with EOS, long enough, and a share >= threshold of its
        tokens correct]; "accuracy": R = the share of correct tokens when it ended with EOS and is long enough, else 0
        (`threshold` unused)."""
        eligible = self.eligible(tokens, mask)
        if self.spec.reward == "accuracy":
            return torch.where(eligible, self.accuracy(tokens, mask), 0.0).to(torch.float64)
        return (eligible & (self.accuracy(tokens, mask) >= threshold)).to(torch.float64)

    def success_threshold(self, eval_seed: int) -> float:
        """q: the `success_quantile` of the initial policy's accuracy on the evaluation sample (ineligible = -1)."""
        tokens, mask = self.sample(self.spec.eval_samples, torch.Generator().manual_seed(eval_seed))
        score = torch.where(self.eligible(tokens, mask), self.accuracy(tokens, mask), -1.0)
        return torch.quantile(score, self.spec.success_quantile).item()

    def evaluate(self, threshold: float, eval_seed: int) -> dict[str, float]:
        """E[R], mean / p90 length, truncation rate and per-token accuracy on the fixed evaluation sample."""
        tokens, mask = self.sample(self.spec.eval_samples, torch.Generator().manual_seed(eval_seed))
        lengths = mask.sum(-1)
        counts = self.correct_counts(tokens, mask).to(torch.float64)
        return {
            "reward": self.rewards(tokens, mask, threshold).mean().item(),
            "length_mean": lengths.mean().item(),
            "length_p90": torch.quantile(lengths, 0.9).item(),
            "truncated": 1.0 - self.ended(tokens).to(torch.float64).mean().item(),
            "token_accuracy": (counts.sum() / lengths.sum()).item(),
            "eligible": self.eligible(tokens, mask).to(torch.float64).mean().item(),
        }


# --------------------------------------------------------------------------------------------------------------------
# One cell


EVAL_SEED = 1_000_003  # the evaluation sample's random numbers: the same at every evaluation of every cell


def run_chain_cell(cfg, cell, spec: ChainSpec) -> dict:
    """Train one v2 cell (`cfg`: a `LabConfig`, `cell`: a `LabCell`, `cell.length` = T) with the v1 protocol.

    A rollout batch of N mini-batches from mu = pi_old, group advantages, N sequential optimizer steps through
    `compute_policy_loss` with the response mask. Returns the summary (E[R], length, truncation, token accuracy at
    the start and the end), the curve (step, E[R] or nan, training reward, mean length) and per mini-batch index the
    mechanism metrics of v1 (log W, ESS, gradient norm, update norm, top-1% share).
    """
    torch.set_num_threads(1)
    policy = ChainPolicy(spec, cell.length, seed=cfg.init_seed)
    params = list(policy.params.values())
    lr = cfg.lr * cell.lr_scale
    if cfg.optim == "adamw_torch":
        opt = torch.optim.AdamW(params, lr=lr, betas=(cfg.beta1, 0.99), eps=cfg.adam_epsilon, weight_decay=0.0)
    else:
        opt = torch.optim.SGD(params, lr=lr)
    gen = torch.Generator().manual_seed(cell.seed)
    threshold = policy.success_threshold(EVAL_SEED)
    start = policy.evaluate(threshold, EVAL_SEED)
    n, m = cell.num_mini_batches, cfg.mini_batch_seqs
    curve = [(0, start["reward"], float("nan"), start["length_mean"])]
    per_k = {k: torch.zeros(n, dtype=torch.float64) for k in LAB_STEP_METRICS}
    rollout_steps = cfg.optimizer_steps // n
    for r in range(rollout_steps):
        tokens, mask = policy.sample(n * m, gen)  # (N*M, T): mu = pi_old
        with torch.no_grad():
            old_lp = policy.log_probs(tokens)
            rewards = policy.rewards(tokens, mask, threshold)
            adv = group_advantages(rewards, cfg.rollout_n)
            order = torch.randperm(n * m, generator=gen)
        for k in range(n):
            idx = order[k * m : (k + 1) * m]
            stats = lab_step(cfg, cell, opt, params, policy.log_probs(tokens[idx]), old_lp[idx], adv[idx], mask[idx], k)
            for key, value in stats.items():
                per_k[key][k] += value / rollout_steps
        exact = (r + 1) % max(1, rollout_steps // cfg.eval_points) == 0 or r + 1 == rollout_steps
        value = policy.evaluate(threshold, EVAL_SEED)["reward"] if exact and r + 1 < rollout_steps else float("nan")
        curve.append([(r + 1) * n, value, rewards.mean().item(), mask.sum(-1).mean().item()])
    final = policy.evaluate(threshold, EVAL_SEED)
    curve[-1][1] = final["reward"]
    finite = all(bool(torch.isfinite(p).all()) for p in params)
    extra = {"threshold": threshold, **{f"initial_{k}": v for k, v in start.items() if k != "reward"}}
    extra |= {f"final_{k}": v for k, v in final.items() if k != "reward"}
    return cell_result(cfg, cell, n, start["reward"], final["reward"], curve, per_k, finite, sampler_kl=0.0, **extra)


LAB_STEP_METRICS = (
    "log_w_mean", "log_w_min", "ess", "grad_norm", "update_norm", "top1_share", "bound_holds",
    "grad_clipped", "kl_mu_pi", "log_w_std", "mean_phi", "momentum_share", "w_top1_share", "grad_norm_clipped",
    "update_g_norm",
)  # fmt: skip


def lab_step(cfg: LabConfig, cell, opt, params, lp, old_lp, adv, mask, k, rollout_lp=None) -> dict[str, Tensor]:
    """One optimizer step of a lab cell (either preset) on mini-batch k of N through `compute_policy_loss`, clipped
    and taken by the learner's functions (`clip_gradient`, `optimizer_step`; grad_clip 0: unclipped), and what
    explains a collapse (`LAB_STEP_METRICS`): sequence log W against mu (exact: no per-token guard), the gradient
    norm before and after clipping, the update's size and the size of its current-gradient part u_g
    (`diagnostics.momentum_parts`), the top-1% share of the per-sequence score coefficient |sum_t dL/dlog pi_t|
    (`top1_share`, a lab-only quantity), whether VESPO's variance bound (Prop. 3.1) held on this mini-batch (nan for
    other methods), and the regime diagnostics the learner logs too, with the learner's definitions: the ESS of W is
    the losses' `is/ess` and `w_top1_share` is the learner's `is/top1pct_w_share` (`top_share` of the guarded
    sequence log W); whether grad_clip cut the step, KL(mu || pi) and the std of log W, mean phi (nan without phi)
    and the momentum share of the step (`vespo.diagnostics`).

    Controls (Z = the mini-batch's mean phi capped at 1, VESPO family): `cfg.step_scale` moves the weights by s x
    Adam's step in the trainer's `optimizer_step` (`vespo.step_control`: s = Z, or VCPO's sqrt ESS);
    `cfg.momentum_scale="mean_phi"` multiplies Adam's first moment by Z before the step, so a mini-batch whose phi
    has collapsed also silences the momentum the fresh mini-batches left (the echo), not only its own gradient."""
    lp.retain_grad()
    loss, metrics = _lab_loss(cfg, cell, lp, old_lp, adv, mask, k, rollout_lp)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = clip_gradient(params, cfg.grad_clip)  # before clipping
    if cfg.momentum_scale == "mean_phi":  # damp the echo: m <- Z m before the step
        _scale_momentum(opt, params, metrics[diagnostics.MEAN_PHI].clamp(max=1.0))  # Z: this mini-batch's mean phi
    momentum_share = diagnostics.momentum_share(opt)  # the state before the step, the clipped gradient
    u_g, _ = diagnostics.momentum_parts(opt)
    # the learner's step, scaled by the step control; always taken (a non-finite cell shows in its summary)
    inputs = (metrics, lp.detach(), old_lp, rollout_lp, mask)
    step = optimizer_step(opt, params, True, step_scale=cfg.step_scale, log_update_norm=True,
                          scaler=None, scheduler=None, step_inputs=inputs)  # fmt: skip
    stats = {
        "grad_norm": grad_norm,
        "update_norm": step["actor/update_norm"],
        "grad_clipped": diagnostics.clip_bound(grad_norm, cfg.grad_clip),
        "mean_phi": diagnostics.mean_phi(metrics),
        "momentum_share": momentum_share,
        "grad_norm_clipped": torch.nn.utils.get_total_norm([p.grad for p in params]),
        "update_g_norm": u_g,  # the current gradient's part of the step (before any step_scale)
    }
    stats |= _weight_stats(metrics, lp, old_lp, mask)
    return {key: stats[key] for key in LAB_STEP_METRICS}


def _lab_loss(cfg, cell, lp, old_lp, adv, mask, k, rollout_lp) -> tuple[Tensor, dict[str, Tensor]]:
    """The cell's policy loss on mini-batch k of N (`compute_policy_loss`, the cell's method and hyperparameters)."""
    context = BatchContext(mini_batch_index=k, num_mini_batches=cell.num_mini_batches)
    return compute_policy_loss(
        cell.method,
        log_prob=lp,
        old_log_prob=old_lp,
        advantages=adv,
        response_mask=mask,
        rollout_log_prob=rollout_lp,
        loss_agg_mode=cfg.loss_agg_mode,
        **({"batch_context": context} if uses_batch_context(cell.method) else {}),
        **dict(cell.hparams),
    )


def _scale_momentum(opt, params, z: Tensor) -> None:
    """Adam's first moment multiplied by `z` in place, before the step."""
    with torch.no_grad():
        for p in params:
            if "exp_avg" in opt.state.get(p, {}):
                opt.state[p]["exp_avg"].mul_(z)


@torch.no_grad()
def _weight_stats(metrics: dict, lp: Tensor, old_lp: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """The mini-batch's weight diagnostics of `lab_step`: exact and guarded sequence log W, the top-1% share of the
    per-sequence score coefficient (from `lp.grad`), the drift from mu, and VESPO's bound (nan for other methods)."""
    log_w = seq_log_ratio(lp.detach(), old_lp, mask, clamp_tokens=False)  # (M,) exact
    guarded = seq_log_ratio(lp.detach(), old_lp, mask)  # (M,) the losses' log W (tokens clamped at +-20)
    coef = (lp.grad * mask).sum(-1).abs()  # (M,) per-sequence score coefficient
    drift = diagnostics.stale_drift(lp.detach(), old_lp, mask)
    bound = (
        (metrics["vespo/phi_sq_mean"] <= metrics["vespo/bound_K_phi_w_mean"]).double()
        if "vespo/phi_sq_mean" in metrics
        else torch.tensor(math.nan)
    )
    return {
        "log_w_mean": log_w.mean(),
        "log_w_min": log_w.min(),
        "ess": torch.nan_to_num(effective_sample_size(guarded, mask.sum(-1) > 0), nan=0.0),  # = the losses' is/ess
        "top1_share": top_share(coef.log()),  # log 0 = -inf: no share
        "bound_holds": bound,
        "kl_mu_pi": drift["kl_mu_pi"],
        "log_w_std": drift["log_w_std"],
        "w_top1_share": top_share(guarded),  # the learner's is/top1pct_w_share
    }


STALEST = ("kl_mu_pi", "log_w_std", "mean_phi", "momentum_share")
"""Regime diagnostics a lab summary reports at the stalest mini-batch (k = N - 1) as `<name>_stalest`."""


def cell_result(cfg, cell, n: int, start: float, final: float, curve: list, per_k: dict, finite: bool, **extra) -> dict:
    """One lab cell's record, either preset: its summary row (collapse = final reward below `collapse_ratio` of the
    start, or non-finite weights; train reward over the last quarter of rollout steps; the regime diagnostics: share
    of optimizer steps cut by grad_clip, and `STALEST` at the stalest mini-batch, averaged over rollout steps, None
    where undefined), curve and per-k means."""
    tail = [c[2] for c in curve[1:]][-max(1, len(curve[1:]) // 4) :] if len(curve) > 1 else [float("nan")]
    summary = {"method": cell.method, "length": cell.length, "staleness": n, "lr_scale": cell.lr_scale}
    summary |= {"seed": cell.seed, "initial_reward": start, "final_reward": final}
    summary |= {"train_reward_last_quarter": float(np.mean(tail))}
    summary |= {"collapsed": int(final < cfg.collapse_ratio * start or not finite), "finite": int(finite)}
    summary |= {"grad_clipped_frac": diagnostics.clip_fraction(per_k["grad_clipped"]).item()}
    stalest = {f"{key}_stalest": per_k[key][-1].item() for key in STALEST}
    summary |= {key: None if math.isnan(v) else v for key, v in stalest.items()}  # None: no phi (not VESPO)
    per_k = {key: v.tolist() for key, v in per_k.items()}
    return {"name": cell.name, "summary": summary | extra, "curve": curve, "per_k": per_k}
