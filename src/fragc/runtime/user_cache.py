"""fragc's folder in the user's cache, and the JSON files kept there: without JAX, so that deciding XLA's CPU threads
at `import fragc` (src/fragc/runtime/cpu_threads.py) imports nothing heavy."""

from __future__ import annotations

import json
import os


def user_cache_folder() -> str:
    """fragc's folder in the user's cache (XDG_CACHE_HOME, else ~/.cache)."""
    return os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "fragc")


def read_json(path: str) -> dict | None:
    """The file's JSON, None where it is missing or damaged (a cache then measures or searches again)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def write_json(path: str, obj: dict) -> None:
    """Written to a file of its own first, then renamed: a reader never sees half a file."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = f"{path}.{os.getpid()}.tmp"
        with open(partial, "w") as f:
            json.dump(obj, f, indent=1, default=str)
        os.replace(partial, path)
    except OSError:  # a cache that cannot be written costs a measurement or a search next time
        pass
