"""Verifiable rewards: Math-Verify grading for math, sandboxed execution for code, reasoning-gym's own verifiers for its
tasks (TRL reward signature)."""

from vespo.data.prompts import PROMPT_SUFFIX
from vespo.rewards.batch import GraderHostError
from vespo.rewards.code_grader import CodeGrade, CodeScores, code_reward, grade_code, score_code
from vespo.rewards.math_grader import MathGrade, MathScores, grade_math, math_reward, score_math
from vespo.rewards.reasoning_gym import TaskGrade, TaskScores, grade_task, reasoning_gym_reward, score_tasks
from vespo.sandbox import SandboxLimits, SandboxRun, run_in_sandbox

__all__ = [
    "PROMPT_SUFFIX",
    "CodeGrade",
    "CodeScores",
    "GraderHostError",
    "MathGrade",
    "MathScores",
    "SandboxLimits",
    "SandboxRun",
    "TaskGrade",
    "TaskScores",
    "code_reward",
    "grade_code",
    "grade_math",
    "grade_task",
    "math_reward",
    "reasoning_gym_reward",
    "run_in_sandbox",
    "score_code",
    "score_math",
    "score_tasks",
]
