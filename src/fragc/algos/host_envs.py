"""Host environments: a vector environment on the host CPU, stepped synchronously from inside the rollout.

`HostVecEnv` gives `VecEnv`'s interface (vec_env.py) to a `HostPool`, a vector environment on the host that takes and
returns numpy arrays: its `reset` and `step` are host calls (`fragc.ir.host.host_call`), which the IR prints with
their bytes under the fragment that makes them. Pools autoreset in the same step (Gymnasium's SAME_STEP), seed
environment i from its own reset key, and live outside the training state: a runner that does not continue its
pool's last step (`HostEnvState.pool_step`, a resumed run) resets them and says so. docs/host_envs.md has the
semantics; `register_host_pool` adds a backend by name (built in: `gymnasium`, `gymnasium_async`, `envpool`).
"""

from __future__ import annotations

import abc
import difflib
import functools
import inspect
import threading
import warnings
from typing import Any, Callable

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fragc.algos.vec_env import BACKENDS, IMPLEMENTATIONS, Runner, Step, VecEnv, split_env_name, to_gymnax_space
from fragc.ir.errors import FragcError
from fragc.ir.host import EnvFleet, host_call


class HostPool(abc.ABC):
    """`num_envs` environments on the host, stepped together, autoreset in the same step.

    Keys are each environment's PRNG key data (uint32 [num_envs, 2]) for this reset or step; a pool
    seeds from the reset keys and may ignore the step keys (only a pool that runs a JAX environment
    on the host, as the tests' gymnax adapter, needs them).
    """

    @classmethod
    @abc.abstractmethod
    def spaces(cls, env_id: str) -> tuple[Any, Any]:
        """(observation space, action space) of one environment: Gymnasium or gymnax spaces."""

    @classmethod
    def max_episode_steps(cls, env_id: str) -> int | None:
        """The environment's time limit (None: it has none, or the pool does not say)."""
        return None

    @classmethod
    def game_stats(cls, env_id: str) -> bool:
        """Whether `step` also returns each environment's game score and game-over flag (after `final_obs`):
        the episode statistics then count whole games at their unclipped score, while the algorithm learns
        from the (clipped) reward and the (per-life) terminations. Atari under EnvPool's episodic life and
        reward clipping does; the default, False, counts the episodes the algorithm sees."""
        return False

    worker_kind: str | None = None
    """What a worker count sets for this backend (`"threads"`), or None: it takes none (`env_workers`); a
    pool that takes one accepts `workers` as the third argument of `__init__`."""

    def __init__(self, env_id: str, num_envs: int, workers: int = 0):
        self.env_id = env_id
        self.num_envs = num_envs
        self.num_workers = workers  # 0: the backend's default

    @abc.abstractmethod
    def reset(self, keys: np.ndarray) -> np.ndarray:
        """Reset every environment -> observations [num_envs, ...]."""

    @abc.abstractmethod
    def step(self, actions: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, ...]:
        """-> (obs after any reset, reward, terminated, truncated, final_obs: the observation reached), then
        (score, game_over) when `game_stats(env_id)`."""

    def send(self, actions: np.ndarray, keys: np.ndarray) -> None:
        """Start a step without waiting for it; `recv` waits and returns what `step` returns. A pool whose
        workers step in the background overrides both; by default the step runs in `recv`."""
        self._sent = (actions, keys)

    def recv(self) -> tuple[np.ndarray, ...]:
        actions, keys = self._sent
        del self._sent
        return self.step(actions, keys)

    def close(self) -> None:
        pass


def seeds_of(keys: np.ndarray) -> list[int]:
    """One seed per environment from its key data: the 64 bits of a threefry key."""
    keys = np.asarray(keys, np.uint64).reshape(len(keys), -1)
    return [int(k[0]) << 32 | int(k[-1]) for k in keys]


class GymnasiumPool(HostPool):
    """`gymnasium.make_vec(..., vectorization_mode="sync")` with SAME_STEP autoreset: every environment
    steps in this process, one after another."""

    mode = "sync"
    vector_kwargs: dict = {}

    @classmethod
    def spaces(cls, env_id: str) -> tuple[Any, Any]:
        try:
            env = gymnasium.make(env_id)
        except gymnasium.error.Error as err:
            raise FragcError(f"gymnasium: cannot make '{env_id}': {err}") from err
        except ImportError as err:  # MuJoCo, Box2D, ... are Gymnasium extras
            raise FragcError(f"gymnasium: cannot make '{env_id}': {err} (MuJoCo environments: "
                             "pip install 'fragc[host]')") from err
        try:
            return env.observation_space, env.action_space
        finally:
            env.close()

    @classmethod
    def max_episode_steps(cls, env_id: str) -> int | None:
        return gymnasium.spec(env_id).max_episode_steps

    def __init__(self, env_id: str, num_envs: int):
        super().__init__(env_id, num_envs)
        self.envs = gymnasium.make_vec(env_id, num_envs=num_envs, vectorization_mode=self.mode, vector_kwargs={
            "autoreset_mode": gymnasium.vector.AutoresetMode.SAME_STEP, **self.vector_kwargs})

    def reset(self, keys: np.ndarray) -> np.ndarray:
        obs, _ = self.envs.reset(seed=seeds_of(keys))
        return obs

    def step(self, actions: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, ...]:
        return _with_final_obs(*self.envs.step(self._actions(actions)))

    def _actions(self, actions: np.ndarray) -> np.ndarray:
        return actions.astype(self.envs.single_action_space.dtype, copy=False)

    def close(self) -> None:
        self.envs.close()


class GymnasiumAsyncPool(GymnasiumPool):
    """`gymnasium.make_vec(..., vectorization_mode="async")`: one worker process per environment, observations
    through shared memory, SAME_STEP autoreset. Workers are spawned, not forked (forking a process that runs
    JAX's threads can deadlock), so the environment id must be registered when its module is imported."""

    mode = "async"
    vector_kwargs = {"shared_memory": True, "context": "spawn"}

    def send(self, actions: np.ndarray, keys: np.ndarray) -> None:
        self.envs.step_async(self._actions(actions))

    def recv(self) -> tuple[np.ndarray, ...]:
        return _with_final_obs(*self.envs.step_wait())


def _with_final_obs(obs: np.ndarray, reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
                    info: dict) -> tuple[np.ndarray, ...]:
    """A Gymnasium vector step's results with the observation each environment reached (SAME_STEP autoreset
    puts it in the info of those that finished)."""
    final_obs = np.array(obs, copy=True)
    for i in np.flatnonzero(info.get("_final_obs", ())):
        final_obs[i] = info["final_obs"][i]
    return obs, reward, terminated, truncated, final_obs


class EnvPoolPool(HostPool):
    """EnvPool's synchronous pool (C++ threads). EnvPool resets a finished environment on the next step
    (NEXT_STEP); this pool resets finished environments at once instead, to give SAME_STEP semantics.
    A worker count sets its C++ threads (`num_threads`; 0 keeps EnvPool's default)."""

    worker_kind = "threads"

    @classmethod
    def spaces(cls, env_id: str) -> tuple[Any, Any]:
        envpool = _import_envpool()
        if env_id not in envpool.list_all_envs():
            close = difflib.get_close_matches(env_id, envpool.list_all_envs(), n=1)
            raise FragcError(f"envpool: unknown environment '{env_id}'"
                             + (f"; did you mean '{close[0]}'?" if close else " (fragc envs lists them)"))
        spec = envpool.make_spec(env_id, **cls.options(env_id))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return spec.observation_space, spec.action_space

    @classmethod
    def max_episode_steps(cls, env_id: str) -> int | None:
        steps = _import_envpool().make_spec(env_id, **cls.options(env_id)).config.max_episode_steps
        return int(steps) if steps else None

    @classmethod
    def options(cls, env_id: str) -> dict[str, Any]:
        """EnvPool's options for `env_id`: `ATARI_OPTIONS` for its Atari games, none for the rest."""
        return dict(ATARI_OPTIONS) if is_envpool_atari(env_id) else {}

    @classmethod
    def game_stats(cls, env_id: str) -> bool:
        return is_envpool_atari(env_id)

    def __init__(self, env_id: str, num_envs: int, workers: int = 0):
        super().__init__(env_id, num_envs, workers)
        self.envs = None
        self.atari = is_envpool_atari(env_id)

    def reset(self, keys: np.ndarray) -> np.ndarray:
        envpool = _import_envpool()
        self.close()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            threads = {"num_threads": self.num_workers} if self.num_workers else {}
            self.envs = envpool.make_gymnasium(self.env_id, num_envs=self.num_envs, seed=seeds_of(keys)[0] % 2**31,
                                               **threads, **self.options(self.env_id))
        obs, info = self.envs.reset()
        return obs[np.argsort(info["env_id"])]

    def step(self, actions: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, ...]:
        self.send(actions, keys)
        return self.recv()

    def send(self, actions: np.ndarray, keys: np.ndarray) -> None:
        self.envs.send(actions, np.arange(self.num_envs, dtype=np.int32))

    def recv(self) -> tuple[np.ndarray, ...]:
        obs, reward, terminated, truncated, info = self.envs.recv()
        order = np.argsort(info["env_id"])
        obs, reward, terminated, truncated = obs[order], reward[order], terminated[order], truncated[order]
        final_obs = obs  # the observations reached; those of finished environments are replaced in a copy
        done = np.flatnonzero(terminated | truncated)
        if len(done):
            obs = np.array(obs, copy=True)
            obs[done] = self._next_start(done)
        if not self.atari:
            return obs, reward, terminated, truncated, final_obs
        score = np.asarray(info["reward"], np.float32)[order]  # the game's own reward, before clipping
        game_over = np.asarray(info["terminated"], bool)[order] | truncated  # not a lost life: the game's end
        return obs, reward, terminated, truncated, final_obs, score, game_over

    def _next_start(self, done: np.ndarray) -> np.ndarray:
        """The first observations after the finished environments `done` (sorted ids). EnvPool's `reset`
        restarts a game; under episodic life, a lost life must continue the game instead, which EnvPool's
        own next step after a termination does (its action ignored): an Atari game takes that step."""
        ids = done.astype(np.int32)
        if self.atari:
            start, *_, info = self.envs.step(np.zeros(len(ids), np.int32), ids)
        else:
            start, info = self.envs.reset(ids)
        return start[np.argsort(info["env_id"])]

    def close(self) -> None:
        if self.envs is not None:
            self.envs.close()


ATARI_OPTIONS = {
    "episodic_life": True, "reward_clip": True,  # set here; EnvPool's defaults are off
    "stack_num": 4, "img_height": 84, "img_width": 84, "gray_scale": True, "frame_skip": 4, "noop_max": 30,
    "full_action_space": False, "repeat_action_probability": 0.0,  # EnvPool's defaults, stated
}
"""CleanRL's `ppo_atari_envpool.py` preprocessing, as EnvPool's options (sticky actions off, as CleanRL has them)."""


@functools.cache
def is_envpool_atari(env_id: str) -> bool:
    """An Atari game of EnvPool's (`Pong-v5`): its config has `episodic_life`."""
    return "episodic_life" in _import_envpool().make_spec(env_id).config._fields


def _import_envpool() -> Any:
    """EnvPool, an optional extra: imported when an envpool: environment is made, refused in one line if missing."""
    try:
        import envpool
    except ImportError as err:
        raise FragcError("the envpool backend needs EnvPool: pip install 'fragc[host]' (or pip install envpool)") from err
    return envpool


_NO_WORKERS = {"gymnasium": "it steps its environments one after another in this process",
               "gymnasium_async": "Gymnasium's AsyncVectorEnv starts one worker process per environment"}

HOST_POOLS: dict[str, type[HostPool]] = {
    "gymnasium": GymnasiumPool, "gymnasium_async": GymnasiumAsyncPool, "envpool": EnvPoolPool}


def register_host_pool(backend: str, pool: type[HostPool], summary: str) -> None:
    """Make `BACKEND:ID` environment names step `pool` on the host (listed by `fragc envs`)."""
    if backend == "gymnax" or ":" in backend:
        raise FragcError(f"cannot register a host backend named {backend!r}")
    HOST_POOLS[backend] = pool
    BACKENDS[backend] = summary
    IMPLEMENTATIONS[backend] = HostVecEnv


# ---------------------------------------------------------------- the VecEnv interface


@struct.dataclass
class HostEnvState:
    """`Runner.env_state` of a host environment, per environment: where it is, and how far the pool was."""

    index: jax.Array  # int32: the environment's index in the host pool
    pool_step: jax.Array  # int32: the pool's step count when this runner was made (0 after a reset)


class HostVecEnv(VecEnv):
    """`VecEnv` over host pools: reset and step are host calls from inside the jitted program.

    Each call steps the pool that holds exactly the environments it was given (by their indices):
    one pool for the whole batch in a fragment with one replica (and in the reference interpreter,
    whose replicas make one call), one pool per device when the fragment runs with R replicas on R
    devices (anakin, actor_learner with several actor devices): each device steps its own
    environments, concurrently with the others. Pools are seeded per environment, so the numbers
    do not depend on how the batch is split.
    """

    on_host = True

    def __init__(self, name: str):
        self.name = name
        backend, self.env_id = split_env_name(name)
        self.pool_type = HOST_POOLS[backend]
        obs_space, action_space = self.pool_type.spaces(self.env_id)
        self._obs_shape = tuple(obs_space.shape or ()) or (1,)
        # What crosses from the host: 8-bit observations (Atari frames) as they are, a quarter of float32's
        # bytes, made float32 on the device; any other dtype as float32 (float64 needs JAX's x64 mode).
        self._wire_dtype = np.dtype(np.uint8) if np.dtype(obs_space.dtype) == np.uint8 else np.dtype(np.float32)
        self.action_space = to_gymnax_space(action_space, name)
        self.game_stats = self.pool_type.game_stats(self.env_id)  # the step returns each game's score and end
        self.pools: dict[tuple[int, ...], _PoolSlot] = {}  # environment indices -> their pool
        self._lock = threading.Lock()  # the devices' host calls come from several threads
        self._reset_keys: dict[int, np.ndarray] = {}  # environment index -> the key data of its last reset
        self.workers = 0  # of each pool (`set_workers`, from the fragment's placement); 0: the backend's default
        self.fleet: Any = None  # remote environment workers (`set_fleet`, src/fragc/algos/ray_envs.py); None: pools here

    @property
    def obs_shape(self) -> tuple[int, ...]:
        return self._obs_shape

    @property
    def obs_dtype(self) -> np.dtype:
        return self._wire_dtype

    @property
    def max_episode_steps(self) -> int | None:
        return self.pool_type.max_episode_steps(self.env_id)

    def reset_each(self, keys: jax.Array, index: jax.Array) -> Runner:
        reset_keys, carry_keys = jax.vmap(jax.random.split, out_axes=1)(keys)
        n = keys.shape[0]
        obs, pool_step = host_call(f"{self.name} reset", self._host_reset, (self._obs_struct(n), _counts(n)),
                                   index, _key_data(reset_keys), resources=self)
        return self._new_runner(HostEnvState(index, pool_step), obs.astype(jnp.float32), carry_keys)

    def step(self, runner: Runner, action: jax.Array, step_keys: jax.Array | None = None) -> tuple[Runner, Step]:
        step_keys, carry_keys = self._keys(runner, step_keys)
        n = action.shape[0]
        flags, floats = jax.ShapeDtypeStruct((n,), jnp.bool_), jax.ShapeDtypeStruct((n,), jnp.float32)
        shapes = (self._obs_struct(n), floats, flags, flags, self._obs_struct(n), _counts(n))
        shapes += (floats, flags) if self.game_stats else ()
        state = runner.env_state
        obs, reward, terminated, truncated, final_obs, pool_step, *game = host_call(
            f"{self.name} step", self._host_step, shapes, state.index, state.pool_step, action, _key_data(step_keys),
            resources=self, begin=self._begin_step)
        return self._advance(runner, HostEnvState(state.index, pool_step), obs.astype(jnp.float32), carry_keys,
                             reward, terminated, truncated, final_obs.astype(jnp.float32), *game)

    def workers_error(self, workers: int) -> str | None:
        """Why this backend's pools cannot take `workers` workers each (None when they can)."""
        backend = split_env_name(self.name)[0]
        if self.pool_type.worker_kind is None:
            return (f"env_workers={workers}: {backend} environments take no worker count ("
                    f"{_NO_WORKERS.get(backend, 'its pool has no such setting')}); a worker count sets EnvPool's "
                    "threads")
        try:
            inspect.signature(self.pool_type).bind(self.env_id, 1, workers)
        except TypeError:
            return (f"env_workers={workers}: {self.pool_type.__name__} says it takes {self.pool_type.worker_kind} "
                    f"but its __init__ takes no third argument (workers)")
        return None

    def set_workers(self, workers: int) -> None:
        """The workers of each pool made from now on (a placement's `env_workers`, checked by `place`). Pools
        already made keep theirs: another program over the same environments may be stepping them."""
        with self._lock:
            self.workers = workers

    def fleet_error(self, fleet: str) -> str | None:
        """Why this environment cannot step on remote workers `fleet` (None when it can)."""
        spec = EnvFleet.parse(fleet)
        if self.pool_type is GymnasiumAsyncPool:
            return (f"env fleet {spec}: gymnasium_async starts a process per environment; on a fleet each worker "
                    "is a process already: use gymnasium:")
        if self.pool_type not in (GymnasiumPool, EnvPoolPool) and not getattr(self.pool_type, "remote", False):
            return (f"env fleet {spec}: {self.pool_type.__name__} is not known to step on remote workers (a "
                    "registered pool says it can with `remote = True`, and must be importable there)")
        return None

    def set_fleet(self, fleet: str) -> None:
        """Step the pools made from now on on the remote workers `fleet`, started here (src/fragc/algos/ray_envs.py):
        refused in one line where they cannot start. The same fleet again keeps the running one."""
        from fragc.algos.ray_envs import RayFleet

        spec = EnvFleet.parse(fleet)
        with self._lock:
            if self.fleet is not None and self.fleet.spec == spec:
                return
            for slot in self.pools.values():
                slot.pool.close()
            self.pools.clear()
            if self.fleet is not None:
                self.fleet.stop()
            self.fleet = RayFleet(spec, self.pool_type, self.name, self.workers, self.game_stats)
            try:
                self.fleet.start()
            except BaseException:
                self.fleet = None
                raise

    def _new_pool(self, n: int, ids: tuple[int, ...]) -> Any:
        """A pool of the environments `ids`: the fleet's workers that hold them, else one in this process."""
        if self.fleet is not None:
            return self.fleet.pool(ids)
        workers = (self.workers,) if self.workers else ()  # a pool that takes no count need not accept one
        return self.pool_type(self.env_id, n, *workers)

    def _flat_obs(self, obs: np.ndarray) -> np.ndarray:
        obs = np.asarray(obs)
        return obs.reshape(obs.shape[0], -1).astype(self._wire_dtype, copy=False)

    def _obs_struct(self, n: int) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((n, self.obs_size), self._wire_dtype)

    # ------------------------------------------------------------ on the host

    def _slot(self, ids: tuple[int, ...]) -> "_PoolSlot | None":
        with self._lock:
            return self.pools.get(ids)

    def _host_reset(self, ids: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return _per_env(ids, lambda ids, keys: lambda: self._reset_pool(ids, keys)[1:], keys)()

    def _reset_pool(self, ids: tuple[int, ...], keys: np.ndarray) -> tuple["_PoolSlot", np.ndarray, np.ndarray]:
        """-> (the pool of `ids`, made if needed, reset from `keys`; observations; pool step counts)."""
        slot = self._slot(ids)
        if slot is None:
            slot = _PoolSlot(self._new_pool(len(ids), ids))
            with self._lock:
                for other in [k for k in self.pools if set(k) & set(ids)]:  # the batch is split differently now
                    self.pools.pop(other).pool.close()
                self.pools[ids] = slot
        obs = self._flat_obs(slot.pool.reset(keys))
        slot.step = 0
        with self._lock:
            self._reset_keys.update(zip(ids, np.asarray(keys)))
        return slot, obs, np.zeros(len(ids), np.int32)

    def _host_step(self, ids: np.ndarray, pool_step: np.ndarray, actions: np.ndarray,
                   keys: np.ndarray) -> tuple[np.ndarray, ...]:
        return self._begin_step(ids, pool_step, actions, keys)()

    def _begin_step(self, ids: np.ndarray, pool_step: np.ndarray, actions: np.ndarray,
                    keys: np.ndarray) -> Callable[[], tuple[np.ndarray, ...]]:
        """`_host_step` started (the pool's `send`) -> a function that waits for it (`recv`) and returns its
        results: a host loop starts one group's step before it dispatches another group's device program."""
        def begin(ids: tuple[int, ...], pool_step: np.ndarray, actions: np.ndarray,
                  keys: np.ndarray) -> Callable[[], tuple[np.ndarray, ...]]:
            slot = self._slot(ids)
            if slot is None and not np.any(pool_step) and all(i in self._reset_keys for i in ids):
                # Freshly reset by a call that held other environments too (`init` runs unsplit, the rollout
                # one pool per device): reset a pool of these with the same keys, which gives the same
                # observations, since pools seed each environment from its own key.
                slot = self._reset_pool(ids, np.stack([self._reset_keys[i] for i in ids]))[0]
            if slot is None or np.any(pool_step != slot.step):
                results = self._reset_on_resume(ids, keys)
                return lambda: results
            slot.pool.send(actions, keys)
            slot.step += 1
            count = np.full(len(ids), slot.step, np.int32)

            def finish() -> tuple[np.ndarray, ...]:
                obs, reward, terminated, truncated, final_obs, *game = slot.pool.recv()
                game = (np.asarray(game[0], np.float32), np.asarray(game[1], bool)) if self.game_stats else ()
                return (self._flat_obs(obs), np.asarray(reward, np.float32), np.asarray(terminated, bool),
                        np.asarray(truncated, bool), self._flat_obs(final_obs), count, *game)

            return finish

        return _per_env(ids, begin, pool_step, actions, keys)

    def _reset_on_resume(self, ids: tuple[int, ...], keys: np.ndarray) -> tuple[np.ndarray, ...]:
        warnings.warn(f"{self.name}: the training state does not continue the host environments' last step (a "
                      "resumed run: their state is not in the checkpoint); resetting them, every episode is "
                      "truncated here", stacklevel=2)
        _, obs, pool_step = self._reset_pool(ids, keys)
        no, zeros = np.zeros(len(ids), bool), np.zeros(len(ids), np.float32)
        return (obs, zeros, no, ~no, obs, pool_step) + ((zeros, ~no) if self.game_stats else ())


class _PoolSlot:
    """A pool and its step count since its last reset (what a runner's `pool_step` must continue)."""

    def __init__(self, pool: HostPool):
        self.pool, self.step = pool, 0


def _counts(n: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((n,), jnp.int32)


def _key_data(keys: jax.Array) -> jax.Array:
    return jax.random.key_data(keys) if jnp.issubdtype(keys.dtype, jax.dtypes.prng_key) else keys


def _per_env(ids: np.ndarray, begin: Callable[..., Callable[[], tuple[np.ndarray, ...]]],
             *arrays: np.ndarray) -> Callable[[], tuple[np.ndarray, ...]]:
    """Call `begin(pool_ids, *arrays)` with the call's environments' rows in index order (`pool_ids`: the sorted
    indices, which name their pool): it starts the call and returns a function that waits for its results, in index
    order; the function returned here puts them in the caller's order and shape (a host loop starts one group's
    step before it dispatches another group's device program).

    `ids` is each row's environment index. A vmapped call (the reference interpreter's replicas:
    `vmap_method="expand_dims"`) adds leading axes; they are flattened here, so one call steps every
    environment it holds. Each environment must appear once.
    """
    ids = np.asarray(ids)
    flat = ids.reshape(-1)
    n = flat.size
    order = np.argsort(flat, kind="stable")
    pool_ids = flat[order]
    repeated = pool_ids[1:][pool_ids[1:] == pool_ids[:-1]]
    if repeated.size:
        raise FragcError(f"a host step received environment {int(repeated[0])} twice in one call")
    if ids.ndim == 1 and np.array_equal(order, np.arange(n)):  # already in index order (a host loop's groups)
        finish = begin(tuple(int(i) for i in pool_ids), *[np.asarray(a) for a in arrays])
        return lambda: tuple(np.asarray(r) for r in finish())
    ordered = [np.asarray(a).reshape((n,) + np.shape(a)[ids.ndim:])[order] for a in arrays]
    finish = begin(tuple(int(i) for i in pool_ids), *ordered)
    inverse = np.argsort(order)  # the caller's row j is row inverse[j] in index order
    return lambda: tuple(np.asarray(r)[inverse].reshape(ids.shape + np.shape(r)[1:]) for r in finish())


IMPLEMENTATIONS.update({backend: HostVecEnv for backend in HOST_POOLS})
