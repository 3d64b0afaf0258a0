"""Verifiable rewards: Math-Verify grading for math, sandboxed execution for code (TRL reward signature)."""

from vespo.rewards.batch import GraderHostError
from vespo.rewards.code import CodeGrade, CodeScores, code_reward, grade_code, score_code
from vespo.rewards.math import PROMPT_SUFFIX, MathGrade, MathScores, grade_math, math_reward, score_math
from vespo.rewards.sandbox import SandboxLimits, SandboxRun, run_in_sandbox

__all__ = [
    "PROMPT_SUFFIX",
    "CodeGrade",
    "CodeScores",
    "GraderHostError",
    "MathGrade",
    "MathScores",
    "SandboxLimits",
    "SandboxRun",
    "code_reward",
    "grade_code",
    "grade_math",
    "math_reward",
    "run_in_sandbox",
    "score_code",
    "score_math",
]
