"""The `fused` schedule: the iteration is one stage; one XLA program loops over k iterations a dispatch.

The loop runs n <= k iterations, n given at run time, so one compilation
serves any run length. A population (the
module's seed offsets) vmaps the loop over a leading axis of the state,
sharded over the devices when they divide it; its fragments then run with one
replica and no mesh, so that the iteration can be vmapped.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fragc.ir.module import Module

from .lower import Lowered, leaf_sharding, lower_fragment, lower_fragments
from .stages import whole_iteration


class FusedProgram:
    """A module whose schedule is `fused`, k iterations a dispatch."""

    donates = True

    def __init__(self, module: Module, devices: Sequence[jax.Device]):
        self.module, self.devices = module, devices
        self.k = module.schedule.iterations_per_dispatch
        population = module.population
        frags = ({name: lower_fragment(f, None) for name, f in module.callable_fragments().items()} if population
                 else lower_fragments(module, devices))
        self.body = Lowered(module, frags)
        self.state_shardings = self._state_shardings()
        lowered = self._lower()
        self.executables = [whole_iteration(module, lowered, self.k)]

    def leaf_sharding(self, leaf: Any) -> Any:
        return leaf_sharding(leaf, self.module, self.devices)

    def __call__(self, state: list[Any], delays: dict | None, n: int) -> tuple[list, dict, list]:
        state, metrics = self.executables[0].compiled(state, np.int32(n))
        return state, {}, metrics

    def _state_shardings(self) -> list[NamedSharding]:
        leaves = self.module.graph.inputs[0].type.leaves
        seeds = len(self.module.population)
        if not seeds:
            return [self.leaf_sharding(t) for t in leaves]
        devices = self.devices if seeds % len(self.devices) == 0 else self.devices[:1]
        mesh = Mesh(np.array(devices), ("population",))
        return [NamedSharding(mesh, P("population")) for _ in leaves]

    def _iteration(self, leaves: list[Any]) -> tuple[list[Any], list[Any]]:
        outs, _ = self.body.iteration(leaves)
        return outs[:len(leaves)], outs[len(leaves):]

    def _lower(self) -> Any:
        k = self.k
        structs = [t.struct() for t in self.module.graph.inputs[0].type.leaves]
        _, metrics_shape = jax.eval_shape(self._iteration, structs)

        def chunk(leaves: list[Any], n: jax.Array) -> tuple[list[Any], Any]:
            # A loop of n <= k iterations (n known at run time) writing each iteration's metrics into
            # row i of a [k, ...] buffer: no `lax.cond` around the iteration, no stacked scan outputs.
            # Both made XLA's program slower than plain jit of the same iteration when the metrics
            # are large (PureJaxRL's per-step info dict: bench/lowering.py).
            def body(i: jax.Array, carry: tuple[list[Any], list[Any]]) -> tuple[list[Any], list[Any]]:
                leaves, rows = carry
                leaves, metrics = self._iteration(leaves)
                return leaves, [r.at[i].set(m) for r, m in zip(rows, metrics)]

            rows = [jnp.zeros((k,) + s.shape, s.dtype) for s in metrics_shape]
            return jax.lax.fori_loop(0, n, body, (leaves, rows))

        if self.module.population:
            chunk = jax.vmap(chunk, in_axes=(0, None), out_axes=(0, 0))  # metrics [seeds, k]
            structs = [jax.ShapeDtypeStruct((len(self.module.population),) + s.shape, s.dtype) for s in structs]
        structs = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh) for s, sh in zip(structs, self.state_shardings)]
        return jax.jit(chunk, donate_argnums=0, out_shardings=(self.state_shardings, None)).lower(
            structs, jax.ShapeDtypeStruct((), jnp.int32))
