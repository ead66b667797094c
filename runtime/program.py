"""A compiled program: its stages, and the loop that dispatches them.

For a module whose iteration is one stage (`single`), the stage scans
`iterations_per_dispatch` iterations in one XLA program; iterations past the
requested count in the last dispatch are skipped with `lax.cond`, so one
compilation serves any run length.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fragc.ir.errors import FragcError
from fragc.ir.interpreter import run_graph
from fragc.ir.module import Module
from fragc.ir.printer import format_module
from fragc.passes.pipeline import PipelineResult

from .lower import group_mesh, lower_fragment, state_shardings


class Program:
    """`fragc.compile`'s result: inspect the IR and stages, then `init` and `run`."""

    def __init__(self, algo: Any, pipeline: PipelineResult, devices: Sequence[jax.Device]):
        self.algo = algo
        self.pipeline = pipeline
        self.module = pipeline.final
        self.devices = list(devices)
        self.k = int(self.module.attrs.get("iterations_per_dispatch", 1))
        self._shardings = state_shardings(self.module, self.devices)
        self._state_tree = self.module.graph.inputs[0].type.treedef
        t0 = time.perf_counter()
        self._init = jax.jit(algo.init, out_shardings=jax.tree.unflatten(self._state_tree, self._shardings))
        self._compiled = self._lower().compile()
        self.compile_seconds = time.perf_counter() - t0

    # ------------------------------------------------------------ inspection

    def ir(self, after: str | None = None) -> str:
        """The module after the named pass (default: the last), as text."""
        return format_module(self.pipeline.after(after))

    @property
    def stages(self) -> list[str]:
        return ["iteration"]

    def hlo(self, stage: str = "iteration", optimized: bool = False) -> str:
        if stage not in self.stages:
            raise FragcError(f"no stage '{stage}'; stages: {', '.join(self.stages)}")
        return self._compiled.as_text() if optimized else self._lowered.as_text()

    def cost(self) -> dict[str, dict[str, float]]:
        """Per stage: flops and bytes accessed per dispatch, from XLA's cost analysis."""
        analysis = self._compiled.cost_analysis() or {}
        return {"iteration": {"flops": float(analysis.get("flops", 0.0)),
                              "bytes": float(analysis.get("bytes accessed", 0.0)),
                              "iterations_per_dispatch": self.k,
                              "collective_bytes": 0.0, "transfer_bytes": 0.0}}

    # ------------------------------------------------------------ running

    def init(self, seed: int) -> Any:
        """The initial training state for `seed`, placed on the program's devices."""
        return self._init(jax.random.key(int(seed)))

    def run(self, state: Any, iterations: int, callback: Callable[[int, dict], None] | None = None
            ) -> tuple[Any, dict[str, np.ndarray]]:
        """Run `iterations` iterations -> (state, history of metrics, one row per iteration).

        `callback(done, metrics)` is called after each dispatch's metrics arrive,
        with the number of iterations done and that dispatch's metrics.
        """
        if not isinstance(iterations, (int, np.integer)) or iterations < 1:
            raise FragcError(f"iterations must be a positive int, got {iterations!r}")
        leaves = self._check_state(state)
        leaves = [jnp.copy(x) for x in leaves]  # the loop donates its buffers; keep the caller's
        rows: list[dict] = []
        pending = None
        done = 0
        while done < iterations:
            n = min(self.k, iterations - done)
            leaves, metrics = self._compiled(leaves, np.int32(n))
            if pending is not None:
                self._collect(rows, *pending, callback)
            done += n
            pending = (metrics, n, done)
        self._collect(rows, *pending, callback)
        history = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
        return jax.tree.unflatten(self._state_tree, leaves), history

    # ------------------------------------------------------------ internals

    def _collect(self, rows: list, metrics: Any, n: int, done: int, callback: Any) -> None:
        host = {k: np.asarray(v)[:n] for k, v in jax.device_get(metrics).items()}
        rows.append(host)
        if callback is not None:
            callback(done, host)

    def _check_state(self, state: Any) -> list[Any]:
        leaves, tree = jax.tree.flatten(state)
        expected = self.module.graph.inputs[0].type
        if tree != self._state_tree or [tuple(x.shape) for x in leaves] != [t.shape for t in expected.leaves]:
            raise FragcError("run: the state does not match the program's state type; use Program.init(seed)")
        return leaves

    def _iteration(self, leaves: list[Any]) -> tuple[list[Any], Any]:
        module = self.module
        lowered = {name: lower_fragment(f, group_mesh(module, f.placement.group, self.devices))
                   for name, f in module.fragments.items()}
        outs = run_graph(module, leaves, lambda node, fdef, ins: lowered[fdef.name](*ins))
        state_out, metrics = jax.tree.unflatten(module.graph.out_tree, outs)
        return jax.tree.leaves(state_out), _metrics_dict(metrics)

    def _lower(self) -> Any:
        k = self.k
        structs = [jax.ShapeDtypeStruct(t.shape, t.dtype, sharding=s)
                   for t, s in zip(self.module.graph.inputs[0].type.leaves, self._shardings)]
        _, metrics_shape = jax.eval_shape(self._iteration, structs)

        def chunk(leaves: list[Any], n: jax.Array) -> tuple[list[Any], Any]:
            def skip(carry: list[Any]) -> tuple[list[Any], Any]:
                return carry, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metrics_shape)

            def body(carry: list[Any], i: jax.Array) -> tuple[list[Any], Any]:
                return jax.lax.cond(i < n, self._iteration, skip, carry)

            return jax.lax.scan(body, leaves, jnp.arange(k))

        self._lowered = jax.jit(chunk, donate_argnums=0, out_shardings=(self._shardings, None)).lower(
            structs, jax.ShapeDtypeStruct((), jnp.int32))
        return self._lowered


def _metrics_dict(metrics: Any) -> dict[str, Any]:
    """Metrics as a flat dict keyed by path, for history and logging."""
    if isinstance(metrics, dict) and all(not isinstance(v, (dict, list, tuple)) for v in metrics.values()):
        return dict(metrics)
    flat = jax.tree_util.tree_flatten_with_path(metrics)[0]
    return {jax.tree_util.keystr(p, simple=True, separator="."): v for p, v in flat}
