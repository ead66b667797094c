"""A compiled program: the final module's schedule, executed, and the loop that dispatches it.

The module says how it runs (`Module.schedule`, decided by the passes); the
program builds the executor for that shape and dispatches it:

- `fused` (src/fragc/runtime/fused.py): one XLA program scans k iterations a dispatch;
- `staged` (src/fragc/runtime/stages.py): one program per stage, `device_put` transfers
  and delays between them, k iterations queued a dispatch;
- `spmd` (src/fragc/runtime/spmd.py): the staged iteration as one SPMD program over the
  union of its groups, collectives for the transfers, k iterations a dispatch.

Metrics of a dispatch are fetched only after the next one is queued.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fragc.ir.host import apply_env_fleet, apply_env_workers, fleet_counters
from fragc.ir.errors import FragcError
from fragc.ir.interpreter import Frame
from fragc.ir.module import Delay, Transfer
from fragc.ir.printer import format_module
from fragc.ir.sweep import swept
from fragc.ir.types import as_arrays
from fragc.passes.pipeline import PipelineResult
from fragc.passes.policy import Policy

from .cost import fragment_collective_bytes, hlo_collective_bytes, hlo_launches, host_bytes, transfer_bytes
from .actions import Action, OnMetrics, Run, check_actions, steps_per_iteration
from .fused import FusedProgram
from .multihost import place, to_host
from .seeds import check_seed
from .spmd import SpmdProgram
from .state_diff import differences, only_static, same_leaf_type
from .stages import Executable, StagedProgram, region_stages

EXECUTORS = {"fused": FusedProgram, "staged": StagedProgram, "spmd": SpmdProgram}
"""The executor of each `Schedule.executor`."""


class Program:
    """`fragc.compile`'s result: inspect the IR and stages, then `init` and `run`."""

    def __init__(self, algo: Any, pipeline: PipelineResult, devices: Sequence[jax.Device], policy: Policy):
        self.algo, self.pipeline, self.policy = algo, pipeline, policy
        self.module = module = pipeline.final
        self.devices = list(devices)
        self.population = module.population
        self.k = module.schedule.iterations_per_dispatch
        self._last = threading.local()  # each thread's latest run: `last_delays`, `last_run`
        self._host_envs = threading.Lock() if any(f.host_steps for f in module.fragments.values()) else None
        self._state_tree = module.graph.inputs[0].type.treedef
        t0 = time.perf_counter()
        self._init = jax.jit(self._init_fn())
        self._executor = EXECUTORS[module.schedule.executor](module, self.devices)
        self._shardings = self._executor.state_shardings
        self.compile_seconds = time.perf_counter() - t0
        apply_env_workers(module)  # the host pools' workers, as placed (and checked by `place`): before `init`
        apply_env_fleet(module)  # and the remote environment workers, started (refused in one line if they cannot)
        self._fleets = fleet_counters(module)
        self._episodes_cut = sum(f.episodes_cut for f in self._fleets)

    @property
    def last_delays(self) -> dict[int, list[Any]] | None:
        """The delay values to continue with after this thread's latest run (None before one)."""
        return getattr(self._last, "delays", None)

    @property
    def last_run(self) -> Run | None:
        """What this thread's latest run reached (`runtime.actions.Run`; None before one)."""
        return getattr(self._last, "run", None)

    # ------------------------------------------------------------ inspection

    def ir(self, after: str | None = None) -> str:
        """The module after the named pass (default: the last), as text."""
        return format_module(self.pipeline.after(after))

    @property
    def stages(self) -> list[str]:
        """The module's stages (`fuse`'s subgraphs), in order."""
        return [s.name for s in self.module.stages]

    @property
    def executables(self) -> list[str]:
        """The compiled XLA programs: one per stage (`staged`), or "iteration" (`fused`, `spmd`)."""
        return [e.name for e in self._executor.executables]

    def _executable(self, name: str) -> Executable:
        """The executable named `name`, or the one that runs stage `name`."""
        for e in self._executor.executables:
            if e.name == name:
                return e
        for e in self._executor.executables:
            if name in e.stages:
                return e
        raise FragcError(f"no stage or executable '{name}'; stages: {', '.join(self.stages)}; "
                         f"executables: {', '.join(self.executables)}")

    def hlo(self, name: str, optimized: bool = False) -> str:
        """StableHLO (or XLA's optimised HLO) of an executable, or of the executable that runs a stage."""
        e = self._executable(name)
        return e.compiled.as_text() if optimized else e.lowered.as_text()

    def cost(self) -> dict[str, dict[str, float]]:
        """Per executable: flops and bytes accessed per call of its program (XLA's cost analysis),
        the iterations one call runs (`iterations_per_dispatch`: k for a fused or SPMD program, 1 for
        a stage of a staged one), and the collective and transfer bytes per iteration; `"total"` sums
        the per-iteration bytes, with the host steps' (src/fragc/ir/host.py) bytes device -> host (`device_to_host_bytes`)
        and host -> device (`host_to_device_bytes`).

        `launches`: the kernel launches one iteration costs on a GPU, estimated from the executable's optimised
        HLO (src/fragc/runtime/cost.py's `hlo_launches`: a proxy read from this backend's program, not a GPU's), times the
        calls of the executable an iteration makes (1/k for a fused or SPMD program; a stage of a loop spanning
        groups its trips; a host loop's step programs once a step and environment group), and `launches_exact`:
        False where a loop's trip count is unknown to XLA (its body counted once: a lower bound). A fused
        program's dispatch loop, whose trip count n <= k is an argument on the CPU, counts k trips, so that its
        body is one iteration's. `"total"` sums the launches per iteration over the executables."""
        out: dict[str, dict[str, float]] = {}
        per_iter_collectives = per_iter_launches = 0.0
        launches_exact = True
        calls = self._calls_per_iteration()
        dispatch_loop = isinstance(self._executor, FusedProgram)  # on the CPU, a loop of n <= k trips, n an argument
        for s in self._executor.executables:
            analysis = s.compiled.cost_analysis() or {}
            frags = set(s.fragments)  # s.fragments: one entry a run (a fragment in a loop: one a trip)
            coll = float(sum(fragment_collective_bytes(self.module.fragments[f]) for f in s.fragments))
            text = s.compiled.as_text()
            if any(self.module.fragments[f].placement.lowering == "jit" for f in frags):
                coll += float(hlo_collective_bytes(text))
            per_iter_collectives += coll
            launches, exact = hlo_launches(text, s.iterations if dispatch_loop else None)
            per_call = calls.get(s.name, 1.0) / s.iterations
            per_iter_launches += launches * per_call
            launches_exact = launches_exact and exact
            out[s.name] = {"flops": float(analysis.get("flops", 0.0)),
                           "bytes": float(analysis.get("bytes accessed", 0.0)),
                           "iterations_per_dispatch": s.iterations,
                           "collective_bytes": coll,
                           "launches": launches * per_call,
                           "launches_exact": exact}
        to_host, from_host = host_bytes(self.module)
        out["total"] = {"collective_bytes": per_iter_collectives, "transfer_bytes": float(transfer_bytes(self.module)),
                        "device_to_host_bytes": float(to_host), "host_to_device_bytes": float(from_host),
                        "launches": per_iter_launches, "launches_exact": launches_exact}
        return out

    def _calls_per_iteration(self) -> dict[str, float]:
        """Calls of each executable per call of its iterations, where not one (every program but a staged
        schedule's runs once a call; `cost` divides by the iterations a call runs): a staged
        schedule's stages of loops spanning groups (`region_stages`: their regions' trips, an upper bound for
        branches) and its host loops' programs (src/fragc/runtime/host_loop.py: `.prefix` and `.suffix` once, `.first` and
        `.last` once a group, `.between{j}` once a step and group, `.step` between consecutive steps, per group)."""
        calls: dict[str, float] = {}
        if not isinstance(self._executor, StagedProgram):
            return calls
        for stage, _, times in region_stages(self.module):
            calls[stage.name] = float(times)
        for loop in getattr(self._executor, "_host_loops", {}).values():
            steps, groups = loop.node.steps, loop.groups
            for e in loop.executables:
                name = e.name.rpartition(".")[2]
                if name in ("first", "last"):
                    calls[e.name] = float(groups)
                elif name == "step":
                    calls[e.name] = float(max(steps - 1, 0) * groups)
                elif name.startswith("between"):
                    calls[e.name] = float(steps * groups)
        return calls

    def memory(self) -> dict[str, dict[str, int]]:
        """Per executable: XLA's memory analysis per device, `argument`, `output` and `temp` bytes (none where
        the backend gives none)."""
        out = {}
        for e in self._executor.executables:
            try:
                m = e.compiled.memory_analysis()
            except Exception:  # noqa: BLE001 - a backend without the analysis
                m = None
            out[e.name] = {} if m is None else {"argument": int(m.argument_size_in_bytes),
                                                "output": int(m.output_size_in_bytes),
                                                "temp": int(m.temp_size_in_bytes)}
        return out

    # ------------------------------------------------------------ running

    def init(self, seed: int) -> Any:
        """The initial training state for `seed`, placed on the program's devices.

        For a population, member i starts from seed `seed + offset_i`. A state whose static
        fields are new objects at each call of `init` (an optimizer built inside it) gets the
        ones the program was traced with, which are the ones the compiled program uses.
        """
        state = self._init(jnp.asarray(check_seed(seed), jnp.uint32))
        if jax.tree.structure(state) != self._state_tree:
            diffs = list(differences(self._expected_state(), state))
            if not only_static(diffs):
                raise FragcError(f"Program.init: {type(self.algo).__name__}.init makes a state whose type differs "
                                 f"from the one fragc traced: {diffs[0].text if diffs else 'its structure'}")
            state = jax.tree.unflatten(self._state_tree, jax.tree.leaves(state))
        return self._place(self._check_state(state, "Program.init"))

    def place_state(self, state: Any) -> Any:
        """A state (for example read from a checkpoint) on the program's devices, leaf by leaf:
        device groups are disjoint device sets, and one jit cannot output to several meshes."""
        return self._place(self._check_state(state, "place_state"))

    def _place(self, leaves: list[Any]) -> Any:
        return jax.tree.unflatten(self._state_tree, [place(x, sh) for x, sh in zip(leaves, self._shardings)])

    def run(self, state: Any, iterations: int, actions: Sequence[Action] = (), *,
            delays: dict[int, list[Any]] | None = None, start: int = 0,
            callback: Callable[[int, dict], None] | None = None) -> tuple[Any, dict[str, np.ndarray]]:
        """Run `iterations` iterations -> (state, history: metric -> array with one row per iteration).

        actions: what to do between dispatches (fragc.actions: metric lines, tracking, checkpoints,
          the finite check, stops, your own), each called as src/fragc/runtime/actions.py describes.
        delays: a pipelined program's delay values to continue from (`last_delays` of an
          earlier run, or a checkpoint's); by default they start from `state`.
        start: the iteration `state` has reached (a resumed run's), from which the actions count.
        callback(iteration, metrics): shorthand for `actions=[OnMetrics(callback)]`.
        After the run, `last_delays` holds the delay values to continue with, and `last_run` what the
        run reached (`runtime.actions.Run`: its last iteration, the latest value of each metric).
        """
        if not isinstance(iterations, (int, np.integer)) or isinstance(iterations, bool) or iterations < 1:
            raise FragcError(f"iterations must be a positive int, got {iterations!r}")
        if not isinstance(start, (int, np.integer)) or isinstance(start, bool) or start < 0:
            raise FragcError(f"start must be a whole number of iterations, got {start!r}")
        actions = check_actions(actions) + ([OnMetrics(callback)] if callback is not None else [])
        leaves = self._check_state(state, "run")
        if self._host_envs is None:
            return self._run(leaves, iterations, actions, delays, start)
        if not self._host_envs.acquire(blocking=False):
            raise FragcError("run: this program steps host environments, which one run at a time can step, and "
                             "another run of it is under way (another thread's); compile a second program for a "
                             "second run at once")
        try:
            return self._run(leaves, iterations, actions, delays, start)
        finally:
            self._host_envs.release()

    def _run(self, leaves: list[Any], iterations: int, actions: list[Action], delays: dict | None,
             start: int) -> tuple[Any, dict[str, np.ndarray]]:
        if delays is not None:
            delays = self.place_delays(delays)
        elif self._executor.donates:  # delays are explicit (and donated) program arguments
            delays = self.initial_delays(jax.tree.unflatten(self._state_tree, leaves))
        if self._executor.donates:  # the program donates its buffers; keep the caller's
            leaves, delays = copies((leaves, delays))
        run = Run(self, int(start), int(start) + int(iterations), steps_per_iteration(self.algo),
                  jax.process_index() == 0)
        self._last.run = run
        started: list[Action] = []
        try:
            for action in actions:
                action.on_start(run)
                started.append(action)
            carry, rows = self._drive(run, actions, (leaves, delays), Frame())
        finally:
            for action in reversed(started):
                action.on_end(run)
        self._last.delays = carry[1]
        axis = 1 if self.population else 0
        history = {k: np.concatenate([r[k] for r in rows], axis=axis) for k in rows[0]}
        return jax.tree.unflatten(self._state_tree, carry[0]), history

    def _drive(self, run: Run, actions: list[Action], carry: tuple, frame: Frame) -> tuple[tuple, list[dict]]:
        """The dispatch loop: dispatch, then hand the actions what they asked for (src/fragc/runtime/actions.py). `frame`:
        what the run carries from dispatch to dispatch besides its state (src/fragc/runtime/stages.py)."""
        rows: list[dict] = []
        pending, done, iterations = None, run.start, run.stop_at
        handed = [run.start] * len(actions)  # the iteration of each action's latest `on_state`
        while done < iterations:
            n = min(self.k, iterations - done)
            if self.module.pbt is not None:  # a dispatch ends on each multiple of PBT's period: its step is there
                n = min(n, self.module.pbt.every - done % self.module.pbt.every)
            carry, metrics = self._dispatch(carry, n, done, frame)
            queued = [a.on_dispatch(done + n, self._tree(carry[0])) for a in actions]
            if pending is not None:
                self._collect(run, actions, rows, *pending)
            done += n
            pending = (metrics, queued, n, done)
            due = [i for i, a in enumerate(actions) if a.every and (done - handed[i] >= a.every or done == iterations)]
            stop = done < iterations and any([a.wants_stop() for a in actions])  # every action asked, in every process
            if stop:
                due = [i for i, a in enumerate(actions) if a.every and handed[i] != done]
            if due or stop:
                self._collect(run, actions, rows, *pending)
                pending = None
            if due:
                state, delays = self._tree(to_host(carry[0])), to_host(carry[1] or {})
                for i in due:
                    actions[i].on_state(done, state, delays)
                    handed[i] = done
            if stop:
                break
        if pending is not None:
            self._collect(run, actions, rows, *pending)
        return carry, rows

    def _tree(self, leaves: list[Any]) -> Any:
        return jax.tree.unflatten(self._state_tree, leaves)

    def place_delays(self, delays: dict) -> dict[int, list[Any]]:
        """Delay values (from a checkpoint) on the devices their delay nodes live on."""
        placed = {}
        for i, node in enumerate(self.module.graph.nodes):
            if isinstance(node, Delay):
                leaves = node.outputs[0].type.leaves
                placed[i] = [place(x, self._executor.leaf_sharding(t)) for x, t in zip(delays[i], leaves)]
        return placed

    def initial_delays(self, state: Any) -> dict[int, list[Any]]:
        """The delay values a run starting from `state` begins with (empty without delays)."""
        return initial_delays(self.module, jax.tree.leaves(state))

    def _dispatch(self, carry: tuple, n: int, start: int = 0, frame: Frame | None = None) -> tuple[tuple, dict]:
        """Up to `k` iterations -> ((state, delays), metrics with one row per iteration)."""
        state, delays, metrics = self._executor(carry[0], carry[1], n, start, frame)
        metrics_tree = self.module.graph.out_tree.children()[1]
        return (state, delays), _metrics_dict(jax.tree.unflatten(metrics_tree, metrics))

    # ------------------------------------------------------------ internals

    def _init_fn(self) -> Callable[[jax.Array], Any]:
        """`seed` -> the initial state; a population's members one after another (`lax.map`), not vmapped.

        A vmapped init batches every matrix factorisation of its members (QR in an orthogonal initializer), and
        jaxlib's batched LAPACK kernels deadlock XLA's CPU thread pool when two of them run at once: the 40-member
        PPO sweep of docs/sweeps.md hung in its first dispatch on 2 cores, every thread waiting in
        `jax::ParallelBatchMap` (gdb). Init runs once, so running the members in turn costs nothing that matters.
        """
        init = lambda seed: self.algo.init(jax.random.key(seed))  # noqa: E731
        if not self.population:  # the function `trace` took the state type from: its trace is JAX's to reuse
            return self.module.init or init
        offsets = jnp.asarray(self.population, jnp.uint32)
        if not self.module.hyperparameters:
            return lambda seed: jax.lax.map(init, seed + offsets)
        algo = swept(self.algo, [f for f, _ in self.module.hyperparameters])
        table = {f: jnp.asarray(v, algo.sweep.dtype(f)) for f, v in self.module.hyperparameters}
        members = jnp.arange(len(self.population), dtype=jnp.int32)
        member_init = lambda args: algo.init(jax.random.key(args[0]), args[1], args[2])  # noqa: E731
        return lambda seed: jax.lax.map(member_init, (seed + offsets, table, members))

    def _collect(self, run: Run, actions: list[Action], rows: list, metrics: Any, queued: list, n: int,
                 done: int) -> None:
        """A dispatch's metrics (and what the actions queued with them) on the host, to the actions."""
        axis = 1 if self.population else 0
        host, queued = to_host((metrics, queued))
        host = {k: np.take(np.asarray(v), np.arange(n), axis=axis) for k, v in host.items()}
        if self._fleets:  # episodes lost workers cut short, counted on the host: at the dispatch's last iteration
            cut = sum(f.episodes_cut for f in self._fleets)
            host["episodes_cut"] = np.zeros(n, np.int32)
            host["episodes_cut"][-1], self._episodes_cut = cut - self._episodes_cut, cut
        rows.append(host)
        run.record(done, host)
        for action, q in zip(actions, queued):
            action.on_metrics(done, host, q)

    def _expected_state(self) -> Any:
        """The program's state type as a pytree of `ShapeDtypeStruct`s (a population's with its member axis)."""
        members = (len(self.population),) if self.population else ()
        leaves = [jax.ShapeDtypeStruct(members + t.shape, t.dtype) for t in self.module.graph.inputs[0].type.leaves]
        return jax.tree.unflatten(self._state_tree, leaves)

    def _check_state(self, state: Any, caller: str) -> list[Any]:
        """The state's leaves, if it has the program's state type; else an error naming the first difference."""
        leaves, tree = jax.tree.flatten(as_arrays(state))
        expected = jax.tree.leaves(self._expected_state())
        if tree == self._state_tree and all(same_leaf_type(e, x) for e, x in zip(expected, leaves)):
            return leaves
        diff = next(differences(self._expected_state(), state), None)
        raise FragcError(f"{caller}: the state does not match the program's state type: "
                         f"{diff.text if diff else 'its structure differs'}; Program.init(seed) makes one that does")


@jax.jit
def _copy_all(xs: list[Any]) -> list[Any]:
    return [jnp.copy(x) for x in xs]


def copies(tree: Any) -> Any:
    """Fresh buffers for every array of `tree`, each with its sharding: one program per device set, not one per leaf
    (a compile of `jnp.copy` for each shape and dtype cost 0.3-0.7 s at a run's start). XLA gives an empty array's
    copy a replicated sharding (MJX's contacts of a model without any: [N, 0]), which the program was not
    compiled for: those are put back."""
    leaves, treedef = jax.tree.flatten(tree)
    groups: dict[Any, list[int]] = {}
    for i, x in enumerate(leaves):
        groups.setdefault(frozenset(x.sharding.device_set), []).append(i)
    out = list(leaves)
    for indices in groups.values():
        for i, y in zip(indices, _copy_all([leaves[i] for i in indices])):
            out[i] = y if y.size or y.sharding == leaves[i].sharding else jax.device_put(y, leaves[i].sharding)
    return jax.tree.unflatten(treedef, out)


def _metrics_dict(metrics: Any) -> dict[str, Any]:
    """Metrics as a flat dict keyed by path, for history and logging."""
    if isinstance(metrics, dict) and all(not isinstance(v, (dict, list, tuple)) for v in metrics.values()):
        return dict(metrics)
    flat = jax.tree_util.tree_flatten_with_path(metrics)[0]
    return {jax.tree_util.keystr(p, simple=True, separator="."): v for p, v in flat}


def initial_delays(module: Any, state: list[Any]) -> dict[int, list[Any]]:
    """What each delay node yields in the first iteration from `state`: its initial operands,
    read through the transfers that bring state leaves to the delay's group."""
    graph = module.graph
    env = dict(zip(graph.inputs[0].uses(), state))
    out = {}
    for i, node in enumerate(graph.nodes):
        if isinstance(node, Transfer) and all(u in env for u in node.inputs):
            env.update(zip(node.outputs[0].uses(), [env[u] for u in node.inputs]))
        elif isinstance(node, Delay):
            out[i] = [env[u] for u in node.initial]
            env.update(zip(node.outputs[0].uses(), out[i]))
    return out
