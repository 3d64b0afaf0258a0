"""Warnings a run raises from its step metrics: updates skipped for a non-finite gradient (`warn_skipped_updates`)
and the ESS alarm (`EssAlarm`), which can stop the run early."""

from __future__ import annotations

import sys


def warn_skipped_updates(step: int, metrics: dict[str, float]) -> None:
    """One stderr line when a step skipped updates with a non-finite gradient (veRL skips them too, silently)."""
    if metrics["actor/nonfinite_grad"] > 0:
        skipped = round(metrics["actor/nonfinite_grad"] * metrics["actor/num_mini_batches"])
        print(f"vespo train: step {step}: skipped {skipped} update(s) with a non-finite gradient", file=sys.stderr)


class EssAlarm:
    """Watches the normalised ESS of the stalest mini-batch's importance weights W (`is/ess/last_mini_batch`, the
    Kish ESS of the sequence weights whatever the method does with them): after `patience` consecutive rollout steps
    below `threshold` it warns once (and, with `stop`, tells the loop to stop). Low ESS of stale mini-batches is a
    documented early sign of collapse (paper Sec. 4.3; veRL's rollout-correction guidance)."""

    KEYS = ("is/ess/last_mini_batch", "is/ess")

    def __init__(self, threshold: float, patience: int, stop: bool):
        self.threshold, self.patience, self.stop = threshold, patience, stop
        self.below, self.fired = 0, False

    def update(self, step: int, metrics: dict[str, float]) -> bool:
        """Count this step; True when the loop should stop now (the alarm fired with `stop`)."""
        ess = next((metrics[k] for k in self.KEYS if k in metrics), None)
        if self.threshold <= 0 or ess is None:
            return False
        self.below = self.below + 1 if ess < self.threshold else 0
        if self.below < self.patience or self.fired:
            return False
        self.fired = True
        action = "stopping (--stop-on-low-ess; --resume continues)" if self.stop else "training continues"
        print(
            f"vespo train: step {step}: ESS of the stalest mini-batch's importance weights below "
            f"{self.threshold:g} for {self.patience} steps (now {ess:.3g}): the stale updates carry little signal, "
            f"an early sign of collapse; consider a smaller staleness, lr or a trust region (target_kl); {action}",
            file=sys.stderr,
        )
        return self.stop
