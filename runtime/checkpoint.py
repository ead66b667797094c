"""Checkpoints of the whole training state, with orbax-checkpoint.

A checkpoint holds the algorithm's state (parameters, optimiser, environments,
PRNG keys), a pipelined program's delay values, and JSON metadata: the
iteration count, the run's configuration and a SHA-256 digest of every array.
orbax writes each checkpoint to a temporary folder and renames it when
complete, so a run killed at any moment leaves only whole checkpoints; the
digest catches one damaged afterwards, and `restore_latest` then falls back
to the previous good one with a warning. No pickle: arrays and JSON only.

In a multi-process run the arrays are gathered to every host first (an RL
agent's state is small): process 0 writes, every process restores the same
checkpoint and lays it out on its devices. The folder must be one that every
process sees (a shared filesystem on a cluster).
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import warnings
from typing import Any

import jax
import numpy as np

from fragc.ir.errors import FragcError


def _encode(tree: Any) -> Any:
    """PRNG keys as their uint32 data; orbax stores plain arrays."""
    def enc(x: Any) -> Any:
        return np.asarray(jax.random.key_data(x)) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else np.asarray(x)

    return jax.tree.map(enc, tree)


def _decode(tree: Any, like: Any) -> Any:
    def dec(x: Any, ref: Any) -> Any:
        if jax.dtypes.issubdtype(ref.dtype, jax.dtypes.prng_key):
            return jax.random.wrap_key_data(np.asarray(x), impl=jax.random.key_impl(ref))
        return np.asarray(x)

    return jax.tree.map(dec, tree, like)


def digest(tree: Any) -> str:
    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(jax.tree_util.keystr(path).encode() + str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


class Checkpointer:
    """Save and restore training state in `directory`, keeping the last `keep` checkpoints."""

    def __init__(self, directory: str, keep: int = 3):
        import orbax.checkpoint as ocp

        logging.getLogger("absl").setLevel(logging.ERROR)
        self.directory = os.path.abspath(directory)
        try:
            os.makedirs(self.directory, exist_ok=True)
            probe = os.path.join(self.directory, f".fragc-write-test-{socket.gethostname()}-{os.getpid()}")
            with open(probe, "w"):
                pass
            os.remove(probe)
        except OSError as err:
            raise FragcError(f"cannot write checkpoints to '{directory}': {err.strerror}") from err
        self._ocp = ocp
        me = jax.process_index()
        # In a multi-process run every process holds the whole state on its host (`Program.run` gathers it):
        # process 0 writes, each process reads on its own, so no manager waits for the others.
        solo = ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})
        self._manager = ocp.CheckpointManager(self.directory, options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=False, multiprocessing_options=solo, create=False))

    def steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def save(self, iteration: int, state: Any, delays: dict, meta: dict) -> None:
        arrays = {"state": _encode(state), "delays": {str(k): _encode(v) for k, v in (delays or {}).items()}}
        meta = {**meta, "iteration": int(iteration), "digest": digest(arrays)}
        ocp = self._ocp
        self._manager.save(int(iteration), args=ocp.args.Composite(
            arrays=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta)), force=True)
        self._manager.wait_until_finished()

    def restore_latest(self, like_state: Any, like_delays: dict) -> tuple[Any, dict, dict]:
        """(state, delays, meta) of the newest checkpoint that reads back intact."""
        like = {"state": _encode(like_state), "delays": {str(k): _encode(v) for k, v in like_delays.items()}}
        steps = self.steps()
        if not steps:
            raise FragcError(f"--resume: no checkpoint in '{self.directory}'")
        ocp = self._ocp
        for step in reversed(steps):
            try:
                restored = self._manager.restore(step, args=ocp.args.Composite(
                    arrays=ocp.args.StandardRestore(like), meta=ocp.args.JsonRestore()))
                arrays, meta = restored["arrays"], restored["meta"]
                if digest(arrays) != meta.get("digest"):
                    raise ValueError("its arrays do not match the digest written with them")
            except Exception as err:  # noqa: BLE001 - any damage means: try the previous one
                warnings.warn(f"checkpoint {step} in '{self.directory}' is damaged ({str(err)[:200]}); "
                              "falling back to the previous one", stacklevel=2)
                continue
            state = _decode(arrays["state"], like_state)
            delays = {int(k): _decode(v, like_delays[int(k)]) for k, v in arrays["delays"].items()}
            return state, delays, meta
        raise FragcError(f"--resume: every checkpoint in '{self.directory}' is damaged")
