"""A compiled program: its stages, the transfers between them, and the loop that dispatches them.

Three shapes of program:

- one stage, no transfers or delays (`single`, `anakin`, `gspmd`, populations):
  one XLA program loops over up to `iterations_per_dispatch` iterations, the
  count given at run time, so one compilation serves any run length;
- several stages (`actor_learner`, `actor_learner_async`): each stage is one
  XLA program on its device group; a static schedule dispatches stages,
  `device_put` transfers and delays in order every iteration. Dispatch is
  asynchronous, so stages on disjoint groups that do not depend on each other
  (rollout k+1 and learn k under staleness 1) overlap without threads;
- the same staged iteration as one SPMD program over the union of its groups
  (`runtime/spmd.py`), scanning k iterations a dispatch, with collectives for
  the transfers: what runs when the groups lie on different processes
  (`transfers="auto"` picks it there), and on request in one process
  (`transfers="collective"`), where it gives the same bits.

Metrics of a dispatch are fetched only after the next one is queued.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fragc.ir.errors import FragcError
from fragc.ir.interpreter import delay_inputs, run_graph
from fragc.ir.module import Delay, Transfer, Value
from fragc.ir.printer import format_module
from fragc.ir.types import LeafType
from fragc.passes.pipeline import PipelineResult
from fragc.passes.policy import Policy

from .cost import fragment_collective_bytes, hlo_collective_bytes, transfer_bytes
from .lower import group_mesh, leaf_sharding, lower_fragment
from .multihost import place, spans_processes, to_host
from .spmd import UnionProgram, union_mesh, unsupported
from .spmd import sharding as union_sharding
from .stages import Stage, compile_stage, plan_stages


TRANSFERS = ("auto", "device_put", "collective")


class Program:
    """`fragc.compile`'s result: inspect the IR and stages, then `init` and `run`."""

    def __init__(self, algo: Any, pipeline: PipelineResult, devices: Sequence[jax.Device], policy: Policy,
                 transfers: str = "auto"):
        self.algo, self.pipeline, self.policy = algo, pipeline, policy
        self.module = module = pipeline.final
        self.devices = list(devices)
        self.population = policy.population
        self.last_delays: dict[int, list[Any]] | None = None
        self.k = int(module.attrs.get("iterations_per_dispatch", 1))
        self._state_tree = module.graph.inputs[0].type.treedef
        self._fused = self._is_one_stage()
        if self.population and not self._fused:
            raise FragcError(f"population runs need a policy whose iteration is one stage; '{policy.name}' has "
                             f"{len(module.attrs['stages'])} stages and transfers")
        self._union = not self._fused and self._choose_union(transfers)
        self._union_mesh = union_mesh(module, self.devices) if self._union else None
        mesh_of = (lambda f: None) if self.population else (
            lambda f: group_mesh(module, f.placement.group, self.devices))
        self._frags = {} if self._union else {  # the union program runs the bodies itself
            name: lower_fragment(f, mesh_of(f)) for name, f in module.fragments.items()}
        self._shardings = self._state_shardings()
        t0 = time.perf_counter()
        self._init = jax.jit(self._init_fn())
        if self._fused:
            self._stages = [self._compile_fused()]
        elif self._union:
            self._stages = [self._compile_union()]
        else:
            self._stages = [compile_stage(s, module, self.devices, self._frags) for s in plan_stages(module)]
        self._stage_starts = {s.nodes[0]: s for s in self._stages}  # the per-iteration schedule's lookups
        self._in_stage = {i for s in self._stages for i in s.nodes}
        self.compile_seconds = time.perf_counter() - t0

    # ------------------------------------------------------------ inspection

    def ir(self, after: str | None = None) -> str:
        """The module after the named pass (default: the last), as text."""
        return format_module(self.pipeline.after(after))

    @property
    def stages(self) -> list[str]:
        return [s.name for s in self._stages]

    def _stage(self, name: str) -> Stage:
        for s in self._stages:
            if s.name == name:
                return s
        raise FragcError(f"no stage '{name}'; stages: {', '.join(self.stages)}")

    def hlo(self, stage: str, optimized: bool = False) -> str:
        """StableHLO of a stage (or XLA's optimised HLO)."""
        s = self._stage(stage)
        return s.compiled.as_text() if optimized else s.lowered.as_text()

    def cost(self) -> dict[str, dict[str, float]]:
        """Per stage: flops and bytes accessed per dispatch (XLA's cost analysis), and the
        collective and transfer bytes per iteration; `"total"` sums the per-iteration bytes."""
        out: dict[str, dict[str, float]] = {}
        per_iter_collectives = 0.0
        for s in self._stages:
            analysis = s.compiled.cost_analysis() or {}
            frags = {self.module.graph.nodes[i].fragment for i in s.nodes if self.module.graph.nodes[i].kind == "run"}
            coll = float(sum(fragment_collective_bytes(self.module.fragments[f]) for f in frags))
            if any(self.module.fragments[f].placement.lowering == "jit" for f in frags):
                coll += float(hlo_collective_bytes(s.compiled.as_text()))
            per_iter_collectives += coll
            out[s.name] = {"flops": float(analysis.get("flops", 0.0)),
                           "bytes": float(analysis.get("bytes accessed", 0.0)),
                           "iterations_per_dispatch": self.k if self._fused or self._union else 1,
                           "collective_bytes": coll}
        out["total"] = {"collective_bytes": per_iter_collectives, "transfer_bytes": float(transfer_bytes(self.module))}
        return out

    # ------------------------------------------------------------ running

    def init(self, seed: int) -> Any:
        """The initial training state for `seed`, placed on the program's devices.

        For a population, member i starts from seed `seed + offset_i`.
        """
        return self.place_state(self._init(jnp.asarray(int(seed), jnp.uint32)))

    def place_state(self, state: Any) -> Any:
        """A state (for example read from a checkpoint) on the program's devices, leaf by leaf:
        device groups are disjoint device sets, and one jit cannot output to several meshes."""
        leaves = self._check_state(state)
        return jax.tree.unflatten(self._state_tree, [place(x, sh) for x, sh in zip(leaves, self._shardings)])

    def run(self, state: Any, iterations: int, callback: Callable[[int, dict], None] | None = None,
            checkpoint: Callable[[int, Any, dict], None] | None = None, checkpoint_every: int = 0,
            delays: dict[int, list[Any]] | None = None) -> tuple[Any, dict[str, np.ndarray]]:
        """Run `iterations` iterations -> (state, history: metric -> array with one row per iteration).

        callback(done, metrics): called as each dispatch's metrics arrive.
        checkpoint(done, state, delays): called with host copies after the dispatch that
          completes each `checkpoint_every` iterations (and after the last one), before the
          next dispatch reuses the buffers.
        delays: a pipelined program's delay values to continue from (`last_delays` of an
          earlier run, or a checkpoint's); by default they start from `state`.
        After the run, `last_delays` holds the delay values to continue with.
        """
        if not isinstance(iterations, (int, np.integer)) or isinstance(iterations, bool) or iterations < 1:
            raise FragcError(f"iterations must be a positive int, got {iterations!r}")
        leaves = self._check_state(state)
        if self._fused or self._union:
            leaves = [jnp.copy(x) for x in leaves]  # the program donates its buffers; keep the caller's
        dispatch = self._dispatch_fused if self._fused else self._dispatch_union if self._union else self._dispatch_staged
        if self._union:  # delays are explicit (and donated) program arguments
            delays = self.place_delays(delays) if delays is not None else self.initial_delays(
                jax.tree.unflatten(self._state_tree, leaves))
            delays = {i: [jnp.copy(x) for x in xs] for i, xs in delays.items()}
        rows: list[dict] = []
        pending, done, carry, saved = None, 0, (leaves, delays), 0
        while done < iterations:
            n = min(self.k, iterations - done)
            carry, metrics = dispatch(carry, n)
            if pending is not None:
                self._collect(rows, *pending, callback)
            done += n
            pending = (metrics, n, done)
            if checkpoint is not None and checkpoint_every and (done - saved >= checkpoint_every or done == iterations):
                self._collect(rows, *pending, callback)
                pending, saved = None, done
                checkpoint(done, jax.tree.unflatten(self._state_tree, to_host(carry[0])), to_host(carry[1] or {}))
        if pending is not None:
            self._collect(rows, *pending, callback)
        self.last_delays = carry[1]
        axis = 1 if self.population else 0
        history = {k: np.concatenate([r[k] for r in rows], axis=axis) for k in rows[0]}
        return jax.tree.unflatten(self._state_tree, carry[0]), history

    def place_delays(self, delays: dict) -> dict[int, list[Any]]:
        """Delay values (from a checkpoint) on the devices their delay nodes live on."""
        placed = {}
        for i, node in enumerate(self.module.graph.nodes):
            if isinstance(node, Delay):
                leaves = node.outputs[0].type.leaves
                placed[i] = [place(x, self._leaf_sharding(t)) for x, t in zip(delays[i], leaves)]
        return placed

    def initial_delays(self, state: Any) -> dict[int, list[Any]]:
        """The delay values a run starting from `state` begins with (empty without delays)."""
        env: dict[Value, list[Any]] = {self.module.graph.inputs[0]: jax.tree.leaves(state)}
        out = {}
        for i, node in enumerate(self.module.graph.nodes):
            if isinstance(node, Transfer) and all(u.value in env for u in node.inputs):
                env[node.outputs[0]] = [env[u.value][u.index] for u in node.inputs]
            elif isinstance(node, Delay):
                out[i] = [env[u.value][u.index] for u in node.initial]
                env[node.outputs[0]] = out[i]
        return out

    # ------------------------------------------------------------ choosing the lowering of a staged program

    def _choose_union(self, transfers: str) -> bool:
        """Staged programs move values with `device_put` within one process, or run as one SPMD
        program with collectives (`runtime/spmd.py`), which is the only way across processes."""
        if transfers not in TRANSFERS:
            raise FragcError(f"transfers must be one of {', '.join(TRANSFERS)}, got {transfers!r}")
        across = spans_processes(self.devices)
        if transfers == "device_put" and across:
            raise FragcError("transfers='device_put' cannot cross processes; use 'collective' or 'auto'")
        if transfers == "device_put" or (transfers == "auto" and not across):
            return False
        reason = unsupported(self.module)
        if reason is not None:
            where = "across processes" if across else "with transfers='collective'"
            raise FragcError(f"policy '{self.policy.name}' cannot run {where}: {reason}")
        return True

    # ------------------------------------------------------------ fused: one stage, k iterations a dispatch

    def _is_one_stage(self) -> bool:
        nodes = self.module.graph.nodes
        return len(self.module.attrs.get("stages", ())) <= 1 and not any(
            isinstance(n, (Transfer, Delay)) for n in nodes)

    def _iteration(self, leaves: list[Any]) -> tuple[list[Any], dict]:
        outs, _ = run_graph(self.module, leaves, lambda node, fdef, ins: self._frags[fdef.name](*ins))
        state_out, metrics = jax.tree.unflatten(self.module.graph.out_tree, outs)
        return jax.tree.leaves(state_out), _metrics_dict(metrics)

    def _compile_fused(self) -> Stage:
        k = self.k
        structs = [jax.ShapeDtypeStruct(t.shape, t.dtype) for t in self.module.graph.inputs[0].type.leaves]
        _, metrics_shape = jax.eval_shape(self._iteration, structs)

        def chunk(leaves: list[Any], n: jax.Array) -> tuple[list[Any], Any]:
            # A loop of n <= k iterations (n known at run time) writing each iteration's metrics into
            # row i of a [k, ...] buffer: no `lax.cond` around the iteration, no stacked scan outputs.
            # Both made XLA's program slower than plain jit of the same iteration when the metrics
            # are large (PureJaxRL's per-step info dict: bench/lowering.py).
            def body(i: jax.Array, carry: tuple[list[Any], Any]) -> tuple[list[Any], Any]:
                leaves, rows = carry
                leaves, metrics = self._iteration(leaves)
                return leaves, jax.tree.map(lambda r, m: r.at[i].set(m), rows, metrics)

            rows = jax.tree.map(lambda s: jnp.zeros((k,) + s.shape, s.dtype), metrics_shape)
            return jax.lax.fori_loop(0, n, body, (leaves, rows))

        if self.population:
            chunk = jax.vmap(chunk, in_axes=(0, None), out_axes=(0, 0))  # metrics [seeds, k]
            structs = [jax.ShapeDtypeStruct((len(self.population),) + s.shape, s.dtype) for s in structs]
        structs = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh) for s, sh in zip(structs, self._shardings)]
        lowered = jax.jit(chunk, donate_argnums=0, out_shardings=(self._shardings, None)).lower(
            structs, jax.ShapeDtypeStruct((), jnp.int32))
        stage = Stage("iteration", self.module.meshes[0].name, tuple(range(len(self.module.graph.nodes))), [], [])
        stage.lowered, stage.compiled = lowered, lowered.compile()
        return stage

    def _dispatch_fused(self, carry: tuple, n: int) -> tuple[tuple, Any]:
        leaves, metrics = self._stages[0].compiled(carry[0], np.int32(n))
        return (leaves, None), metrics

    # ------------------------------------------------------------ union: one SPMD program over all groups

    def _compile_union(self) -> Stage:
        self._union_program = UnionProgram(self.module, self._union_mesh, self.k)
        stage = Stage("iteration", ",".join(m.name for m in self.module.meshes),
                      tuple(range(len(self.module.graph.nodes))), [], [])
        stage.lowered, stage.compiled = self._union_program.lowered, self._union_program.compiled
        return stage

    def _dispatch_union(self, carry: tuple, n: int) -> tuple[tuple, Any]:
        leaves, delays, metrics = self._union_program(carry[0], carry[1], n)
        return (leaves, delays), _metrics_dict(jax.tree.unflatten(self.module.graph.out_tree.children()[1], metrics))

    # ------------------------------------------------------------ staged: a schedule per iteration

    def _dispatch_staged(self, carry: tuple, n: int) -> tuple[tuple, Any]:
        leaves, delayed = carry
        graph = self.module.graph
        env: dict[Value, list[Any]] = {graph.inputs[0]: list(leaves)}
        by_first, in_stage = self._stage_starts, self._in_stage
        for i, node in enumerate(graph.nodes):
            if i in by_first:
                s = by_first[i]
                outs = s.compiled(*[env[u.value][u.index] for u in s.inputs])
                for u, x in zip(s.outputs, outs):
                    env.setdefault(u.value, [None] * len(u.value.type.leaves))[u.index] = x
            elif i in in_stage:
                continue
            elif isinstance(node, Transfer):
                value = node.outputs[0]
                env[value] = [jax.device_put(env[u.value][u.index], leaf_sharding(t, self.module, self.devices))
                              for u, t in zip(node.inputs, value.type.leaves)]
            elif isinstance(node, Delay):
                uses = node.initial
                env[node.outputs[0]] = delayed[i] if delayed else [env[u.value][u.index] for u in uses]
        outs = [env[u.value][u.index] for u in graph.outputs]
        state_out, metrics = jax.tree.unflatten(graph.out_tree, outs)
        metrics = jax.tree.map(lambda x: x[None], _metrics_dict(metrics))
        return (jax.tree.leaves(state_out), delay_inputs(self.module, env)), metrics

    # ------------------------------------------------------------ internals

    def _init_fn(self) -> Callable[[jax.Array], Any]:
        init = lambda seed: self.algo.init(jax.random.key(seed))  # noqa: E731
        if not self.population:
            return init
        offsets = jnp.asarray(self.population, jnp.uint32)
        return lambda seed: jax.vmap(init)(seed + offsets)

    def _leaf_sharding(self, leaf: LeafType) -> NamedSharding:
        if self._union:
            return union_sharding(leaf, self._union_mesh)
        return leaf_sharding(leaf, self.module, self.devices)

    def _state_shardings(self) -> list[NamedSharding]:
        leaves = self.module.graph.inputs[0].type.leaves
        if not self.population:
            return [self._leaf_sharding(t) for t in leaves]
        devices = self.devices if len(self.population) % len(self.devices) == 0 else self.devices[:1]
        mesh = Mesh(np.array(devices), ("population",))
        return [NamedSharding(mesh, P("population")) for _ in leaves]

    def _collect(self, rows: list, metrics: Any, n: int, done: int, callback: Any) -> None:
        axis = 1 if self.population else 0
        host = {k: np.take(np.asarray(v), np.arange(n), axis=axis) for k, v in to_host(metrics).items()}
        rows.append(host)
        if callback is not None:
            callback(done, host)

    def _check_state(self, state: Any) -> list[Any]:
        leaves, tree = jax.tree.flatten(state)
        expected = [t.shape for t in self.module.graph.inputs[0].type.leaves]
        if self.population:
            expected = [(len(self.population),) + s for s in expected]
        if tree != self._state_tree or [tuple(x.shape) for x in leaves] != expected:
            raise FragcError("run: the state does not match the program's state type; use Program.init(seed)")
        return leaves


def _metrics_dict(metrics: Any) -> dict[str, Any]:
    """Metrics as a flat dict keyed by path, for history and logging."""
    if isinstance(metrics, dict) and all(not isinstance(v, (dict, list, tuple)) for v in metrics.values()):
        return dict(metrics)
    flat = jax.tree_util.tree_flatten_with_path(metrics)[0]
    return {jax.tree_util.keystr(p, simple=True, separator="."): v for p, v in flat}
