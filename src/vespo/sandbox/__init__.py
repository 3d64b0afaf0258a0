"""Run untrusted Python confined (namespaces, seccomp, rlimits, cgroups) and collect its outputs as plain data: the
code grader's engine (`vespo.rewards.code_reward`), usable on its own. Threat model: docs/guides/rewards.md."""

from vespo.sandbox._procs import UID_BASE
from vespo.sandbox.limits import SandboxLimits
from vespo.sandbox.runner import (
    GraderHostError,
    SandboxRun,
    SandboxUnavailable,
    namespaces_work,
    run_in_sandbox,
)

__all__ = [
    "UID_BASE",
    "GraderHostError",
    "SandboxLimits",
    "SandboxRun",
    "SandboxUnavailable",
    "namespaces_work",
    "run_in_sandbox",
]
