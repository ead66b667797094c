"""What a run reports: a fingerprint of its parameters, its algorithm's config, metric lines, the compilation
cache."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from typing import Any, TextIO

import jax
import numpy as np

from fragc.ir.errors import FragcError

from .user_cache import user_cache_folder

from .multihost import to_host


def params_fingerprint(state: Any) -> str:
    """SHA-256 of the parameters' bytes (`state.learner.params` if there is one, else the whole state),
    leaves in key-path order, so two runs can be compared exactly."""
    tree = getattr(getattr(state, "learner", None), "params", state)
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        array = np.asarray(to_host(leaf))
        digest.update(jax.tree_util.keystr(path).encode())
        digest.update(str(array.dtype).encode() + str(array.shape).encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:16]


def write_error(folder: str) -> OSError | None:
    """Why a file cannot be written in `folder` (None where it can): a file made and removed there at once, since
    `os.access` says yes to root in a read-only folder or file system."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as err:
        return err


def check_metrics_file(path: str) -> None:
    """Refuse, in one line and before anything compiles, a metrics file that `MetricsWriter` could not open: a
    folder, or a file in a folder that is missing or not writable."""
    if os.path.isdir(path):
        raise FragcError(f"cannot write metrics to '{path}': it is a folder")
    if write_error(os.path.dirname(os.path.abspath(path))) is not None:
        raise FragcError(f"cannot write metrics to '{path}': its folder is missing or not writable")


class MetricsWriter:
    """One JSON line per reporting interval: iteration, env steps, wall time and each metric's mean.

    A resumed run passes `resume_from`, the iteration of the checkpoint it continues from: the
    rows after it (written before a crash, and about to be written again) are dropped, so the
    file reads as one uninterrupted run's.
    """

    def __init__(self, path: str, resume_from: int | None = None):
        self.path = path
        try:
            if resume_from is not None:
                keep_rows_until(path, resume_from)
            self._file: TextIO = open(path, "w" if resume_from is None else "a")
        except OSError as err:
            raise FragcError(f"cannot write metrics to '{path}': {err.strerror}") from err

    def write(self, iteration: int, env_steps: int, wall_s: float, metrics: dict[str, np.ndarray]) -> None:
        row = {"iteration": iteration, "env_steps": env_steps, "wall_s": round(wall_s, 3)}
        row.update({k: float(np.mean(v)) for k, v in metrics.items()})
        try:
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()
        except OSError as err:
            raise FragcError(f"cannot write metrics to '{self.path}': {err.strerror}") from err

    def close(self) -> None:
        try:
            self._file.close()
        except OSError:  # the failed write was reported; what did not reach the file is lost either way
            pass


def keep_rows_until(path: str, iteration: int) -> None:
    """Rewrite the metrics file at `path` (if any) with only its rows up to `iteration`, atomically."""
    if not os.path.isfile(path):  # nothing yet, or not a file to rewrite (a pipe, /dev/stdout)
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    rows = [(line.rstrip("\n") + "\n", _row_iteration(line)) for line in lines]
    kept = [line for line, at in rows if at is not None and at <= iteration]
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w", encoding="utf-8") as f:
        f.writelines(kept)
    os.replace(partial, path)


def _row_iteration(line: str) -> int | None:
    """The iteration of a metric row; None for a line that is not one (e.g. cut short by a crash)."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    iteration = row.get("iteration") if isinstance(row, dict) else None
    return iteration if isinstance(iteration, int) else None


def config_dict(algo: Any) -> dict | None:
    """The algorithm's config as it reads back from JSON (tuples become lists), None without one."""
    config = getattr(algo, "config", None)
    if not (dataclasses.is_dataclass(config) and not isinstance(config, type)):
        return None
    return json.loads(json.dumps(dataclasses.asdict(config), default=str))


def default_cache_dir() -> str:
    return os.environ.get("FRAGC_CACHE_DIR") or os.path.join(user_cache_folder(), "jax")


def enable_compilation_cache(path: str | None = None) -> str:
    """JAX's persistent compilation cache in `path` (default: the user's cache folder), for every program."""
    path = path or default_cache_dir()
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise FragcError(f"cannot use compilation cache folder '{path}': {err.strerror} (or pass --no-cache)") from err
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path
