"""Hub reachability: offline runs must fail in seconds with advice, not after minutes of retries."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Quick TCP probe of the Hugging Face endpoint (False when HF_HUB_OFFLINE is set)."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout_s):
            return True
    except OSError:
        return False
