"""Remote environment workers: host environments stepped by Ray actors, on this machine or a cluster's others.

A fleet (`ir.host.EnvFleet`, placed by the IR: `env_fleet=ray:2x4`) is N Ray actors (`EnvWorker`) of E environments
each, for one `HostVecEnv`; each owns a `HostPool` of its backend. A pool of the host loop is a `RayPool` over the
whole workers that hold its environments: `send` starts every worker's step, `recv` fetches them, so remote groups
pipeline as local ones do. A worker that Ray restarts has its environments reset from derived seeds, and that step
reported as their episodes cut short; a worker whose restarts are spent, or a lost Ray head, is one error.
docs/distributed.md has the semantics.
"""

from __future__ import annotations

import os
import pickle
import socket
import threading
import time
import warnings
from typing import Any

import numpy as np

from fragc.distributed import EXIT_LOST, say_and_exit
from fragc.ir.errors import FragcError
from fragc.ir.host import EnvFleet

MAX_RESTARTS = 4
"""How many times Ray restarts a lost worker before the run fails."""

HEAD_LOST_AFTER_S = 15.0
"""How long the Ray head's GCS may go unanswering before the run stops in one line (Ray's own core worker ends
the process after `RAY_gcs_rpc_server_reconnect_timeout_s`, 60 s by default, from C++, in Ray's words)."""

EXIT_HEAD_LOST = EXIT_LOST
"""Exit code of a run that stops because the Ray head was lost: a lost process's (fragc.distributed)."""

START_TIMEOUT_S = 120.0
"""How long the workers may take to start (Ray places them, each makes its environments) before the run is
refused."""


def import_ray() -> Any:
    """Ray, an optional extra: refused in one line where it is not installed."""
    try:
        import ray
    except ImportError as err:
        raise FragcError("env fleet ray:...: remote environment workers need Ray: pip install 'fragc[ray]'") from err
    return ray


def connect(address: str | None = None) -> Any:
    """Join the Ray cluster at `address` (else `RAY_ADDRESS`; `auto`: the one `ray start` started on this machine),
    or start a new local Ray where none is named (not whatever cluster `ray start` last left on this machine:
    `ray.init()` alone would join that); nothing where this process has joined one already. Refused in one line
    where the address does not answer."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address and address != "auto" and not address.startswith("ray://"):
        _check_reachable(address)
    try:
        with warnings.catch_warnings():  # JAX's warning on os.fork: Ray forks only to exec its processes
            warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called")
            ray.init(address=address or "local", include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                     configure_logging=True)
    except Exception as err:  # noqa: BLE001 - Ray raises bare Exceptions too ("The current node timed out during
        # startup" under load): any failure to start or join is one line, not Ray's traceback
        where = f"the Ray cluster at '{address}'" if address else "a local Ray"
        raise FragcError(f"cannot start or join {where}: {str(err).splitlines()[0][:200]}") from err
    return ray


def _connect(address: str, timeout_s: float) -> None:
    """Open and close a TCP connection to HOST:PORT (an empty host: this machine); OSError where none answers."""
    host, _, port = address.rpartition(":")
    socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()


def _check_reachable(address: str) -> None:
    try:
        _connect(address, 5)
    except (OSError, ValueError) as err:
        raise FragcError(f"no Ray cluster answers at '{address}' (--ray-address / RAY_ADDRESS; HOST:PORT of the "
                         f"head's GCS, `ray start --head` prints it): {err}") from err


class EnvWorker:
    """A remote environment worker (the Ray actor's class): a host pool of `num_envs` environments.

    `step` answers None where the pool has not been reset since the worker (re)started: its environments were
    lost with the process it ran in."""

    def __init__(self, pool_type: type, env_id: str, num_envs: int, threads: int):
        self.pool = pool_type(env_id, num_envs, *((threads,) if threads else ()))
        self.ready = False

    def reset(self, keys: np.ndarray) -> np.ndarray:
        obs = self.pool.reset(keys)
        self.ready = True
        return np.asarray(obs)

    def step(self, packed: bytes) -> bytes | None:
        """`pack(actions, keys)` -> `pack(*the pool's step's results, seconds)` (`seconds`: the step's own time,
        for the latency split); None where the worker's environments were lost."""
        if not self.ready:
            return None
        started = time.perf_counter()
        out = tuple(np.asarray(x) for x in self.pool.step(*unpack(packed)))
        return pack(*out, np.float64(time.perf_counter() - started))

    def echo(self, sent: bytes = b"", back: bytes = b"") -> bytes:
        """`back`: a call that moves a step's bytes (`sent` in, `back` out) and steps nothing (bench/ray_envs.py's
        latency split)."""
        return back

    def where(self) -> tuple[int, str]:
        import ray

        return os.getpid(), ray.get_runtime_context().get_node_id()


class RayFleet:
    """The workers of one `HostVecEnv`'s fleet, started once (`start`), and the pools that view them."""

    def __init__(self, spec: EnvFleet, pool_type: type, name: str, threads: int, game_stats: bool):
        self.spec, self.pool_type, self.name, self.threads, self.game_stats = spec, pool_type, name, threads, game_stats
        self.env_id = name.partition(":")[2]
        self.actors: list[Any] = []
        self.restarts = [0] * spec.workers
        self.episodes_cut = 0  # environments whose episode a lost worker cut short, since the fleet started
        self.step_seconds = 0.0  # the workers' own stepping time (summed over calls), for the latency split
        self.watched = False  # counted among the fleets whose head `watch_head` watches

    def start(self) -> None:
        """Connect to Ray, check that the cluster has what the workers ask for, make them and wait until each has
        made its environments: each failure one line, before training."""
        ray = connect()
        spec = self.spec
        totals = ray.cluster_resources()
        wanted = {"CPU": spec.workers * spec.cpus, **{r: float(spec.workers) for r in spec.resources}}
        for name, amount in wanted.items():
            if totals.get(name, 0.0) < amount:
                raise FragcError(f"env fleet {spec}: {spec.workers} workers ask Ray for {amount:g} {name} in all but "
                                 f"the cluster has {totals.get(name, 0.0):g} (`ray status`); use fewer workers, "
                                 f"fewer cpus per worker (ray:...,cpus=0.5) or a larger cluster")
        remote = ray.remote(EnvWorker).options(
            num_cpus=spec.cpus, resources={r: 1 for r in spec.resources} or None, max_restarts=MAX_RESTARTS,
            max_task_retries=0)
        self.actors = [remote.remote(self.pool_type, self.env_id, spec.envs_per_worker, self.threads)
                       for _ in range(spec.workers)]
        pending = {a.where.remote(): w for w, a in enumerate(self.actors)}
        ready, waiting = ray.wait(list(pending), num_returns=len(pending), timeout=START_TIMEOUT_S)
        if waiting:
            self.stop()
            raise FragcError(f"env fleet {spec}: {len(waiting)} of {spec.workers} workers did not start within "
                             f"{START_TIMEOUT_S:g} s (the cluster's free resources: `ray status`)")
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayError as err:
                self.stop()
                raise FragcError(f"env fleet {spec}: worker {pending[ref]} cannot make "
                                 f"'{self.name}': {_cause(err)}") from err
        watch_head(ray.get_runtime_context().gcs_address, str(spec))
        self.watched = True

    def stop(self) -> None:
        global _fleets_running
        ray = import_ray()
        if self.watched:
            _fleets_running, self.watched = _fleets_running - 1, False
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []

    def pool(self, ids: tuple[int, ...]) -> "RayPool":
        """The pool of environments `ids` (sorted): the whole workers that hold them."""
        e = self.spec.envs_per_worker
        workers = sorted({i // e for i in ids})
        if list(ids) != [i for w in workers for i in range(w * e, (w + 1) * e)]:
            raise FragcError(f"env fleet {self.spec}: a pool of environments {ids[0]}..{ids[-1]} is not whole "
                             f"workers of {e}; use a worker count that the environment groups divide")
        return RayPool(self, workers)


class RayPool:
    """A `HostPool` (src/fragc/algos/host_envs.py) over whole workers of a fleet: `send` starts every worker's step,
    `recv` fetches them, and a worker lost on the way has its environments reset (module docstring)."""

    def __init__(self, fleet: RayFleet, workers: list[int]):
        self.fleet, self.workers = fleet, workers
        self.e = fleet.spec.envs_per_worker
        self.num_envs = self.e * len(workers)
        self.keys = np.zeros((self.num_envs, 2), np.uint32)
        self.steps = 0
        self._refs: list[Any] | None = None

    def _rows(self, k: int) -> slice:
        return slice(k * self.e, (k + 1) * self.e)

    def reset(self, keys: np.ndarray) -> np.ndarray:
        self.keys, self.steps = np.asarray(keys), 0
        refs = [self.fleet.actors[w].reset.remote(self.keys[self._rows(k)]) for k, w in enumerate(self.workers)]
        return np.concatenate([self._get(ref, w) for ref, w in zip(refs, self.workers)])

    def send(self, actions: np.ndarray, keys: np.ndarray) -> None:
        actions, keys = np.asarray(actions), np.asarray(keys)
        self._refs = [self.fleet.actors[w].step.remote(pack(actions[self._rows(k)], keys[self._rows(k)]))
                      for k, w in enumerate(self.workers)]
        self.steps += 1

    def recv(self) -> tuple[np.ndarray, ...]:
        refs, self._refs = self._refs, None
        parts = []
        for k, (ref, w) in enumerate(zip(refs, self.workers)):
            result = self._get(ref, w, lost_ok=True)
            result = self._cut_short(k, w) if result is None else unpack(result)
            *result, seconds = result
            self.fleet.step_seconds += float(seconds)
            parts.append(result)
        return tuple(np.concatenate(leaf) for leaf in zip(*parts))

    def step(self, actions: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, ...]:
        self.send(actions, keys)
        return self.recv()

    def close(self) -> None:
        """Nothing: the workers belong to the fleet, and another pool may view them."""

    def _get(self, ref: Any, w: int, lost_ok: bool = False) -> Any:
        """`ray.get(ref)` of worker w's call; None where the worker was lost (`lost_ok`), else one error."""
        ray = import_ray()
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as err:
            if lost_ok and self.fleet.restarts[w] < MAX_RESTARTS:
                return None
            raise FragcError(f"env fleet {self.fleet.spec}: worker {w} was lost and Ray restarts it no more "
                             f"({self.fleet.restarts[w]} restarts of {MAX_RESTARTS}): {_cause(err)}") from err
        except ray.exceptions.RayError as err:
            raise FragcError(f"env fleet {self.fleet.spec}: lost the Ray cluster ({_cause(err)}); the run stops "
                             "here, its last checkpoint kept (continue with --resume once the cluster is back)"
                             ) from err

    def _when_restarted(self, call: Any, w: int) -> Any:
        """`call()` once worker w answers again: Ray refuses calls while it restarts the actor."""
        ray = import_ray()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                return call()
            except FragcError as err:
                if not isinstance(err.__cause__, ray.exceptions.ActorUnavailableError) or time.monotonic() > deadline:
                    raise
            time.sleep(0.1)

    def _cut_short(self, k: int, w: int) -> tuple[np.ndarray, ...]:
        """The step of worker w (the pool's k-th), lost with it: its environments reset from fresh seeds, the
        step reported as every one's episode cut short."""
        fleet, rows = self.fleet, self._rows(k)
        fleet.restarts[w] += 1
        fresh = derived_keys(self.keys[rows], self.steps, fleet.restarts[w])
        obs = self._when_restarted(lambda: self._get(fleet.actors[w].reset.remote(fresh), w), w)
        fleet.episodes_cut += self.e
        warnings.warn(f"env fleet {fleet.spec}: worker {w} was lost at step {self.steps} and restarted by Ray; its "
                      f"{self.e} environments were reset with fresh seeds, their episodes cut short there "
                      "(truncated, reward 0)", stacklevel=2)
        no, zeros = np.zeros(self.e, bool), np.zeros(self.e, np.float32)
        game = (zeros, ~no) if fleet.game_stats else ()
        return (obs, zeros, no, ~no, obs) + game + (0.0,)


_head_watch: threading.Thread | None = None
_fleets_running = 0  # fleets started and not stopped: the head is watched while there is one


def watch_head(gcs_address: str, fleet: str, lost_after_s: float = HEAD_LOST_AFTER_S,
               interval_s: float = 1.0) -> None:
    """Watch the Ray head's GCS (a TCP connect each `interval_s`) from a daemon thread, once per process; after
    `lost_after_s` without an answer, end the process with one fragc line. The workers on other nodes go on
    stepping without the head (actor calls do not pass through it), so no call fails to tell the run; Ray's own
    core worker would end the process a minute later from C++. Checkpoints are written whole or not at all
    (orbax renames a finished one into place), so the last one written is what `--resume` continues from."""
    global _head_watch, _fleets_running
    _fleets_running += 1
    if _head_watch is not None and _head_watch.is_alive():
        return

    def watch() -> None:
        silent_since = None
        while True:
            time.sleep(interval_s)
            if not _fleets_running or not import_ray().is_initialized():  # nothing to watch for
                silent_since = None
                continue
            try:
                _connect(gcs_address, interval_s)
                silent_since = None
            except OSError:
                silent_since = silent_since or time.monotonic()
                if time.monotonic() - silent_since >= lost_after_s:
                    say_and_exit(f"fragc: error: env fleet {fleet}: lost the Ray cluster's head (its GCS at "
                                 f"{gcs_address} has not answered for {lost_after_s:g} s); the run stops here, its "
                                 "last checkpoint kept (continue with --resume once the cluster is back)",
                                 EXIT_HEAD_LOST)

    _head_watch = threading.Thread(target=watch, name="fragc-ray-head-watch", daemon=True)
    _head_watch.start()


def pack(*arrays: np.ndarray) -> bytes:
    """Arrays as one bytes object: one object per call crosses Ray (7 separate arrays cost ~2x the call's time
    on 2 cores: bench/ray_envs.py)."""
    return pickle.dumps(arrays, protocol=pickle.HIGHEST_PROTOCOL)


def unpack(packed: bytes) -> tuple[np.ndarray, ...]:
    return pickle.loads(packed)


def derived_keys(keys: np.ndarray, step: int, restart: int) -> np.ndarray:
    """Fresh key data (uint32 [n, 2]) for environments reset after a lost worker: from each one's last reset key,
    the pool's step count and the worker's restart count, so a rerun that loses the worker there resets alike."""
    out = np.empty((len(keys), 2), np.uint32)
    for i, key in enumerate(np.asarray(keys, np.uint32).reshape(len(keys), -1)):
        out[i] = np.random.SeedSequence([*map(int, key), step, restart]).generate_state(2)
    return out


def _cause(err: BaseException) -> str:
    """The first line of what a Ray error says of its cause (the worker's own exception where it has one)."""
    cause = getattr(err, "cause", None) or err
    lines = [line for line in str(cause).splitlines() if line.strip()]
    error_lines = [line for line in lines if "Error" in line and not line.startswith(" ")]
    return (error_lines[-1] if error_lines else lines[0] if lines else type(err).__name__).strip()[:300]
