"""Model and tokenizer loading: the one place a causal LM is loaded (trainer, samplers, evaluation, lab)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import transformers


def looks_local(value: str) -> bool:
    """A path rather than a Hub id ("org/name"): absolute, relative with ./ or ~, or more than one slash."""
    return value.startswith(("/", ".", "~")) or value.count("/") > 1 or "\\" in value


def check_model_source(value: str) -> None:
    """An existing model directory or a Hub id (only checkable by downloading it); a one-line ValueError otherwise."""
    path = Path(value).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ValueError(f"{value} exists but is not a model directory (no config.json in it)")
    elif looks_local(value):
        raise ValueError(f"no such directory {value} (a Hub id looks like 'org/name')")


def resolve_device(name: str) -> torch.device:
    """`auto` (CUDA when present, else CPU), `cpu`, `cuda` or `cuda:i`; a one-line ValueError for anything else or for
    a CUDA device this machine does not have."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    head, _, index = name.partition(":")
    if head != "cuda" or (index and not index.isdigit()):
        raise ValueError(f"expected auto | cpu | cuda | cuda:<index>, got {name!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"{name} requested but torch sees no CUDA device (use auto or cpu)")
    if index and int(index) >= torch.cuda.device_count():
        raise ValueError(f"{name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return torch.device(name)


def hub_offline_reason(timeout: float = 3.0) -> str | None:
    """Why the Hugging Face Hub cannot be used right now (offline mode set, or its endpoint unreachable within
    `timeout` seconds), or None: a Hub id then fails in seconds with one line instead of minutes of retries."""
    import urllib.error
    import urllib.request

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").lower() in ("1", "true", "yes", "on"):
            return f"{var} is set"
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout)
    except urllib.error.HTTPError:
        return None  # the server answered
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"{endpoint} is unreachable ({getattr(exc, 'reason', exc)})"
    return None


def quiet_hf_progress() -> None:
    """Silence Hugging Face's own progress bars (weight loading, shard writing, downloads, datasets) in this process
    and in the processes it starts: what `--no-progress` promises."""
    import sys

    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # read at import by huggingface_hub (spawned samplers)
    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"
    transformers.utils.logging.disable_progress_bar()
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()


def _hub_unusable(path: str | Path) -> str | None:
    """Why the Hub id `path` cannot be downloaded now (the HF cache is then read in offline mode, no minutes of
    retries), or None: a local path, or a Hub that answers."""
    if Path(path).expanduser().exists():
        return None
    reason = hub_offline_reason()
    if reason is not None:
        import huggingface_hub.constants

        huggingface_hub.constants.HF_HUB_OFFLINE = True  # what is_offline_mode() reads: no request is even tried
    return reason


def load_tokenizer(path: str | Path, *, local_files_only: bool = False) -> transformers.PreTrainedTokenizerBase:
    """The tokenizer of a Hub id or local dir, with pad = eos when it has no pad token (batched sampling pads)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=local_files_only)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(
    path: str | Path, *, dtype: torch.dtype = torch.float32, local_files_only: bool = False
) -> transformers.PreTrainedModel:
    """A causal LM through `from_pretrained` (fp32 master weights by default)."""
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=local_files_only)


def load_policy(
    path: str | Path, *, dtype: torch.dtype = torch.float32
) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase]:
    """A causal LM (fp32 master weights by default) and its tokenizer through `from_pretrained`; a Hub id that can
    be neither downloaded nor found in the cache is one ValueError line, in seconds (the Hub is probed once)."""
    reason = _hub_unusable(path)
    offline = reason is not None
    try:
        return load_model(path, dtype=dtype, local_files_only=offline), load_tokenizer(path, local_files_only=offline)
    except OSError as exc:
        if reason is None:
            raise
        raise ValueError(f"model {str(path)!r}: the Hub cannot be used ({reason}) and there is no cached copy") from exc
