"""Checkpoints of the whole training state, with orbax-checkpoint.

A checkpoint holds the algorithm's state (parameters, optimiser, environments,
PRNG keys), a pipelined program's delay values, and JSON metadata: the
iteration count, the run's configuration, a SHA-256 digest of every array, and
a digest of the metadata itself (all of it, the array digest included). orbax
writes each checkpoint to a temporary folder and renames it when complete, so
a run killed at any moment leaves only whole checkpoints; the digests catch
one damaged afterwards. `restore_latest` then moves the damaged one aside (to
`STEP.damaged`, kept for inspection, and out of the way of the run that
writes that step again) and falls back to the previous one with a warning.
A checkpoint written with another configuration is not damaged: resuming from
it is refused, naming the options that differ; and so is one whose arrays are
laid out for another state (an earlier fragc's, or the algorithm's state
changed), naming the first array that differs. No pickle: arrays and JSON only.

In a multi-process run the arrays are gathered to every host first (an RL
agent's state is small): process 0 writes, every process restores the same
checkpoint and lays it out on its devices. The folder must be one that every
process sees (a shared filesystem on a cluster).
"""

from __future__ import annotations

import errno
import gc
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import sys
import traceback
import warnings
from typing import Any

import jax
import numpy as np

from fragc.ir.errors import FragcError

FORMAT = 2
"""Version of the checkpoint layout; 2: the metadata is covered by its own digest."""

_RUN_KEYS = {"algo": "algo", "policy": "--policy", "devices": "--devices", "seed": "--seed"}
"""Metadata that must match for a run to resume, and the option that sets each; plus every config field."""


def _encode(tree: Any) -> Any:
    """PRNG keys as their uint32 data; orbax stores plain arrays."""
    def enc(x: Any) -> Any:
        return np.asarray(jax.random.key_data(x)) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else np.asarray(x)

    return jax.tree.map(enc, tree)


def array_layout(tree: Any) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each leaf's dotted path (as orbax names it, `state.runner.obs`) -> (shape, dtype)."""
    def part(key: Any) -> str:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                return str(getattr(key, attr))
        return str(key)

    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {".".join(part(k) for k in path): (tuple(x.shape), str(x.dtype)) for path, x in leaves}


def layout_difference(written: dict, expected: dict) -> str | None:
    """The first difference between two `array_layout`s, in words; None when they agree."""
    for name in sorted(set(written) | set(expected)):
        if name not in written:
            return f"it has no {name}"
        if name not in expected:
            return f"its {name} is not in this run's state"
        if written[name] != expected[name]:
            (s1, d1), (s2, d2) = written[name], expected[name]
            return f"its {name} is {d1}{list(s1)}, this run's {d2}{list(s2)}"
    return None


def _like(tree: Any) -> Any:
    """Host arrays shaped as `tree`'s encoded leaves, without reading them: the leaves of a
    multi-process run span devices this process cannot read."""
    def zeros(x: Any) -> np.ndarray:
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.eval_shape(jax.random.key_data, x)
        return np.zeros(x.shape, x.dtype)

    return jax.tree.map(zeros, tree)


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


def meta_digest(meta: dict) -> str:
    """SHA-256 of every metadata field but `digest` itself, in a canonical JSON form."""
    body = {k: v for k, v in meta.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def config_difference(saved: dict, run: dict) -> list[str]:
    """What differs between a checkpoint's metadata and this run's, one phrase per field
    (`--lr is 0.00025 in the checkpoint and 0.001 here`), as the options that set them."""
    run = json.loads(json.dumps(run))  # tuples as lists, as the metadata stores them
    if saved.get("algo") != run.get("algo"):  # another algorithm: its config fields are beside the point
        return [_phrase("algo", saved.get("algo"), run.get("algo"))]
    diffs = [_phrase(flag, saved.get(key), run.get(key)) for key, flag in _RUN_KEYS.items()
             if key in run and saved.get(key) != run.get(key)]
    ours, theirs = run.get("config", {}), saved.get("config") or {}
    for field in sorted(set(ours) | set(theirs)):
        if ours.get(field) != theirs.get(field):
            diffs.append(_phrase("--" + field.replace("_", "-"), theirs.get(field), ours.get(field)))
    return diffs


def _phrase(name: str, saved: Any, here: Any) -> str:
    shown = lambda v: "not set" if v is None else repr(v)  # noqa: E731
    return f"{name} is {shown(saved)} in the checkpoint and {shown(here)} here"


class Damaged(Exception):
    """A checkpoint that does not read back as it was written."""


class Checkpointer:
    """Save and restore training state in `directory`, keeping the last `keep` checkpoints."""

    def __init__(self, directory: str, keep: int = 3):
        import orbax.checkpoint as ocp  # 3-4 s of CPU to import: only a run that checkpoints pays for it

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
        self._quiet = _QuietFailedReads(self.directory)
        me = jax.process_index()
        self._primary = me == 0
        # In a multi-process run every process holds the whole state on its host (`Program.run` gathers it):
        # process 0 writes, each process reads on its own, so no manager waits for the others.
        solo = ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})
        self._manager = ocp.CheckpointManager(self.directory, options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=False, multiprocessing_options=solo, create=False))

    def close(self) -> None:
        """Stop orbax's manager (its threads and event loop); the checkpoints stay."""
        self._manager.close()
        self._quiet.stop()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def steps(self) -> list[int]:
        self._manager.reload()  # another process may have written since
        return sorted(self._manager.all_steps())

    def save(self, iteration: int, state: Any, delays: dict, meta: dict) -> None:
        arrays = {"state": _encode(state), "delays": {str(k): _encode(v) for k, v in (delays or {}).items()}}
        meta = {**meta, "iteration": int(iteration), "format": FORMAT, "arrays_digest": digest(arrays)}
        meta["digest"] = meta_digest(meta)
        ocp = self._ocp
        self._require_space(iteration, arrays)
        try:
            self._manager.save(int(iteration), args=ocp.args.Composite(
                arrays=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta)), force=True)
            self._manager.wait_until_finished()
        except Exception as err:  # noqa: BLE001 - orbax reports a full disk as ValueError or RuntimeError
            raise FragcError(f"cannot write the checkpoint of iteration {iteration} to '{self.directory}': "
                             f"{_os_reason(err)}; the earlier checkpoints are kept") from err

    def _require_space(self, iteration: int, arrays: dict) -> None:
        """Refuse before orbax starts: a disk that fills mid-write leaves its threads printing tracebacks.
        A checkpoint takes up to about twice its arrays' bytes on disk, plus orbax's files."""
        need = 2 * sum(np.asarray(x).nbytes for x in jax.tree.leaves(arrays)) + 2**20
        free = shutil.disk_usage(self.directory).free
        if free < need:
            raise FragcError(f"cannot write the checkpoint of iteration {iteration} to '{self.directory}': "
                             f"{os.strerror(errno.ENOSPC)} ({free / 2**20:.2f} MiB free, about "
                             f"{need / 2**20:.2f} MiB needed); the earlier checkpoints are kept")

    def restore_latest(self, like_state: Any, like_delays: dict, run: dict | None = None) -> tuple[Any, dict, dict]:
        """(state, delays, meta) of the newest checkpoint that reads back intact.

        run: this run's metadata (algo, config, policy, devices, seed); a checkpoint
          written with other values is refused with a FragcError naming them.
        """
        steps = self.steps()
        if not steps:
            raise FragcError(f"--resume: no checkpoint in '{self.directory}'")
        like = {"state": _like(like_state), "delays": {str(k): _like(v) for k, v in like_delays.items()}}
        self._quiet.start()  # a damaged checkpoint's failed read leaves orbax's reader talking to a closed loop
        for step in reversed(steps):
            try:
                meta = self._read_meta(step)
                self._check_run(step, meta, run)
                self._check_layout(step, like)
                arrays = self._read_arrays(step, like, meta)
            except Damaged as err:
                self._quiet.failed = True
                warnings.warn(f"checkpoint {step} in '{self.directory}' is damaged ({str(err)[:200]}); "
                              f"{self._set_aside(step)}falling back to the previous one", stacklevel=2)
                continue
            state = _decode(arrays["state"], like_state)
            delays = {int(k): _decode(v, like_delays[int(k)]) for k, v in arrays["delays"].items()}
            return state, delays, meta
        raise FragcError(f"--resume: every checkpoint in '{self.directory}' is damaged")

    def check_run(self, run: dict) -> None:
        """Refuse, before anything is compiled, to resume from a checkpoint another configuration wrote: the
        newest whose metadata reads back is compared with `run` (only the fields `run` has). Damaged ones are
        left to `restore_latest`, which warns and sets them aside."""
        for step in reversed(self.steps()):
            try:
                meta = self._read_meta(step)
            except Damaged:
                continue
            self._check_run(step, meta, run)
            return

    def _read_meta(self, step: int) -> dict:
        try:
            meta = self._manager.restore(step, args=self._ocp.args.Composite(meta=self._ocp.args.JsonRestore()))["meta"]
        except Exception as err:  # noqa: BLE001 - whatever orbax raises on a file it cannot read
            raise Damaged(f"its metadata does not read back: {_first_line(err)}") from err
        if not isinstance(meta, dict):
            raise Damaged("its metadata is not a JSON object")
        if "format" not in meta and "digest" in meta:
            raise FragcError(f"--resume: the checkpoints in '{self.directory}' were written by an earlier fragc "
                             f"whose format this one does not read; start afresh with another --checkpoint-dir")
        if meta.get("digest") != meta_digest(meta):
            raise Damaged("its metadata does not match the digest written with it")
        if meta.get("format") != FORMAT or meta.get("iteration") != step:
            raise Damaged(f"its metadata says format {meta.get('format')!r}, iteration {meta.get('iteration')!r}")
        return meta

    def _check_run(self, step: int, meta: dict, run: dict | None) -> None:
        if run is not None and (diffs := config_difference(meta, run)):
            raise FragcError(f"--resume: the checkpoint at iteration {step} in '{self.directory}' was written by "
                             f"another configuration: {'; '.join(diffs)}. Resume with the same options, or start "
                             f"afresh with another --checkpoint-dir")

    def _check_layout(self, step: int, like: dict) -> None:
        """Refuse a checkpoint whose arrays are laid out for another state (one written by an earlier fragc, or
        before the algorithm's state changed): it is whole, not damaged, and is left where it is."""
        try:
            saved = self._manager.item_metadata(step)["arrays"].tree
        except Exception:  # noqa: BLE001 - unreadable metadata: `_read_arrays` finds it damaged
            return
        written = {leaf.name: (tuple(leaf.shape), str(leaf.dtype))
                   for leaf in jax.tree.leaves(saved, is_leaf=lambda x: hasattr(x, "shape"))}
        if (difference := layout_difference(written, array_layout(like))) is not None:
            raise FragcError(f"--resume: the checkpoint at iteration {step} in '{self.directory}' holds a state "
                             f"laid out otherwise than this run's ({difference}): it was written by another fragc "
                             f"or another version of the algorithm. Start afresh with another --checkpoint-dir")

    def _read_arrays(self, step: int, like: dict, meta: dict) -> dict:
        ocp = self._ocp
        try:
            arrays = self._manager.restore(step, args=ocp.args.Composite(arrays=ocp.args.StandardRestore(like)))["arrays"]
        except Exception as err:  # noqa: BLE001 - whatever orbax raises on a file it cannot read
            raise Damaged(f"its arrays do not read back: {_first_line(err)}") from err
        if digest(arrays) != meta["arrays_digest"]:
            raise Damaged("its arrays do not match the digest written with them")
        return arrays

    def _set_aside(self, step: int) -> str:
        """Move a damaged checkpoint to `STEP.damaged` (process 0 only), where orbax no longer
        sees it: the resumed run writes that step again. -> a phrase for the warning."""
        if not self._primary:
            return ""
        path = os.path.join(self.directory, str(step))
        target, n = f"{path}.damaged", 1
        while os.path.exists(target):
            n += 1
            target = f"{path}.damaged.{n}"
        try:
            os.rename(path, target)
        except OSError as err:
            return f"could not move it aside ({err.strerror}); "
        finally:
            self._manager.reload()
        return f"moved to '{os.path.basename(target)}'; "


class _QuietFailedReads:
    """Silence what orbax's reader prints after a read fails: the first failure ends its event loop
    while tensorstore's other reads of that checkpoint are in flight, and each of those, finishing
    later on a tensorstore thread, reports `RuntimeError: Event loop is closed` as an unraisable
    exception (a bare traceback on stderr, dozens of them); a task whose failure nobody awaited may
    also be logged by asyncio at garbage collection. The warning of `restore_latest` says what
    happened in one line instead.

    Only those are dropped: an unraisable `RuntimeError('Event loop is closed')` raised in asyncio's
    `_check_closed`, and asyncio's log records of an error that names this checkpoint folder;
    everything else reaches the hook and the handlers that were there. Started when restoring,
    stopped by `Checkpointer.close` (the late reads are done long before a run ends; the tasks
    still uncollected are collected first)."""

    def __init__(self, directory: str):
        self.directory = directory
        self.previous: Any = None
        self.hook: Any = None
        self.failed = False  # set by `restore_latest` when a read failed

    def start(self) -> None:
        if self.hook is not None:
            return
        self.previous = previous = sys.unraisablehook

        def hook(unraisable: Any) -> None:
            if not _closed_loop_noise(unraisable):
                previous(unraisable)

        self.hook = sys.unraisablehook = hook
        logging.getLogger("asyncio").addFilter(self._asyncio_record)

    def stop(self) -> None:
        if self.hook is None:
            return
        if self.failed:  # the abandoned reads' tasks log when collected: collect them while filtered
            gc.collect()
        if sys.unraisablehook is self.hook:  # else someone replaced it since: theirs stays
            sys.unraisablehook = self.previous
        logging.getLogger("asyncio").removeFilter(self._asyncio_record)
        self.hook = self.previous = None

    def _asyncio_record(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (error is not None and self.directory in str(error))


def _closed_loop_noise(unraisable: Any) -> bool:
    error = unraisable.exc_value
    if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed" and unraisable.object is None):
        return False
    frames = traceback.extract_tb(unraisable.exc_traceback)
    return bool(frames) and frames[-1].name == "_check_closed" and "asyncio" in frames[-1].filename


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__


def _os_reason(err: BaseException) -> str:
    """The operating system's reason behind an error from orbax's writers (which wrap it in text),
    else its first line."""
    for cause in (err, err.__cause__, err.__context__):
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
    code = re.search(r"os_error_code='(\d+)'", str(err))
    return os.strerror(int(code.group(1))) if code else _first_line(err)
