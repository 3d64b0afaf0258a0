"""veRL custom reward function wiring vespo's verifiers: Math-Verify for math, sandboxed execution for code.

    reward.custom_reward_function.path=examples/verl/reward_fn.py
    reward.custom_reward_function.name=compute_score

veRL calls `compute_score(data_source, solution_str, ground_truth, extra_info)` once per response. Rows whose
`data_source` names a code dataset are graded by `vespo.rewards.code_reward`; every other row by
`vespo.rewards.math_reward` (1.0 iff the final answer matches `ground_truth`).
"""

from __future__ import annotations

import json

from vespo.rewards import code_reward, math_reward

# data_source values of the code datasets (PRIME-RL/Eurus-2-RL-Data: codecontests, apps, taco, codeforces, ...).
CODE_SOURCES = ("code", "apps", "taco", "codeforces", "leetcode", "livecodebench", "humaneval", "mbpp")


def eurus_tests(ground_truth) -> list[dict]:
    """Test cases in vespo's format from Eurus-2/PRIME's `{"inputs": [...], "outputs": [...], "fn_name"?}`."""
    tests = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    if isinstance(tests, dict) and "inputs" in tests and "outputs" in tests:
        extra = {"fn_name": tests["fn_name"]} if tests.get("fn_name") else {}
        return [{"input": i, "output": o, **extra} for i, o in zip(tests["inputs"], tests["outputs"], strict=True)]
    return tests  # already vespo's format (list of {input, output} / {fn_name, ...} / {assert})


def is_code(data_source: str) -> bool:
    """Whether a row's data_source is one of the code datasets."""
    return any(name in data_source.lower() for name in CODE_SOURCES)


def compute_score(data_source: str, solution_str: str, ground_truth, extra_info: dict | None = None) -> float:
    """veRL reward: 1.0 for a correct response (math answer or all tests passed), else 0.0."""
    if is_code(data_source):
        return code_reward([solution_str], [eurus_tests(ground_truth)])[0]
    return math_reward([solution_str], [str(ground_truth)])[0]
