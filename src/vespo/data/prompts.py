"""The one prompt format of training and evaluation: the paper's math instruction, the code instruction, and the
optional chat template."""

from __future__ import annotations

PROMPT_SUFFIX = "Please reason step by step, and put your final answer within \\boxed{}."
"""The paper's instruction appended to every math question (VESPO Sec. 4 setup; official preprocess_datasets.py)."""
CODE_INSTRUCTION = "Write a complete Python solution and put it in a single ```python code block."


def math_prompt(question: str) -> str:
    """The paper's math prompt: the question followed by the step-by-step / ``\\boxed{}`` instruction."""
    return f"{question.strip()} {PROMPT_SUFFIX}"


def format_prompts(tokenizer, prompts: list[str], *, chat: bool) -> list[str]:
    """The one prompt format of training and evaluation: the text as is, or, with ``chat``, the user turn through
    the tokenizer's chat template (instruct models). A model trained on plain prompts is evaluated on plain ones."""
    if not chat:
        return list(prompts)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("chat prompts were asked for (apply_chat_template) but the tokenizer has no chat template")
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]
