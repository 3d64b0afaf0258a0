"""Whether the Hugging Face Hub can be reached now: one check that the loaders of models, datasets and benchmarks
share, so a Hub id fails in seconds with one line instead of minutes of retries."""

from __future__ import annotations

import os


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
