"""The search's files: its decisions (keyed by the algorithm's configuration, the devices, fragc's version and
the candidate space) and the machine constants of the cost model, one JSON file each."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from fragc.runtime.reporting import config_dict, default_cache_dir


def cache_folder() -> str:
    """Where the decisions and the machine constants are kept: FRAGC_CACHE_DIR/auto, else beside JAX's
    compilation cache."""
    env = os.environ.get("FRAGC_CACHE_DIR")
    return os.path.join(env or os.path.dirname(default_cache_dir()), "auto")


def algo_key(algo: Any) -> dict:
    """The algorithm as the cache sees it: its class and its config (or its plain attributes)."""
    config = config_dict(algo)
    if config is None:
        plain = {k: v for k, v in sorted(vars(algo).items()) if isinstance(v, (int, float, str, bool, type(None)))}
        config = plain
    return {"algo": f"{type(algo).__module__}.{type(algo).__qualname__}", "config": config}


def digest(obj: Any) -> str:
    """A file name's part for `obj` (JSON), the same in every process."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:24]


