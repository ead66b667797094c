"""insert_delays{staleness}: actors read the learner's parameters `staleness` iterations late.

Every operand of an actor fragment that is a state leaf whose next value comes
from another device group goes through `staleness` `delay` nodes. Rollout k+1
then no longer waits for learn k, so the two overlap; the reference
interpreter reproduces the delays exactly (`fragc.ir.interpreter.run_iterations`).
So do the operands of a region on one group that runs evaluator fragments only
(evaluation episodes, algos/evaluation.py, under `lax.cond`): an evaluation acts
with the parameters the actors act with, and the actors' devices, which run it,
need not wait for the learner either.
"""

from __future__ import annotations

import dataclasses

from fragc.ir.errors import FragcError
from fragc.ir.module import REGION_KINDS, Delay, Module, Node, Run, Use, Value, walk
from fragc.ir.types import TreeType

from .pipeline import Pass
from .policy import EVALUATOR


@dataclasses.dataclass(frozen=True)
class InsertDelays(Pass):
    staleness: int = 0
    role: str = "actor"
    name = "insert_delays"

    def run(self, module: Module) -> Module:
        if not isinstance(self.staleness, int) or self.staleness < 0:
            raise FragcError(f"insert_delays: staleness must be a non-negative int, got {self.staleness!r}")
        if self.staleness == 0:
            return module
        graph = module.graph
        state = graph.inputs[0]
        nodes, delayed = [], {}
        for node in graph.nodes:
            group = self._acting_group(module, node)
            if group is not None:
                stale = [u.value is state and u.type.group != group for u in node.inputs]
                if any(stale):
                    uses = tuple(u for u, s in zip(node.inputs, stale) if s)
                    key = (uses, group)
                    if key not in delayed:
                        delayed[key] = self._delays(uses, group, nodes, len(delayed))
                    node = node.replace(inputs=_rewire(node.inputs, stale, delayed[key]))
            nodes.append(node)
        if not delayed:
            raise FragcError(f"insert_delays: no '{self.role}' fragment reads state produced on another device group; "
                             "nothing to pipeline")
        return module.replace(graph=graph.replace(nodes=tuple(nodes)))

    def _acting_group(self, module: Module, node: Node) -> str | None:
        """The group of a run of a `role` fragment, or of a region on one group whose runs are all evaluator
        fragments; None for any other node."""
        if isinstance(node, Run):
            fdef = module.fragments[node.fragment]
            return fdef.placement.group if fdef.role == self.role else None
        if isinstance(node, REGION_KINDS):
            roles = {module.fragments[n.fragment].role for g in node.regions for n in walk(g.nodes)
                     if isinstance(n, Run)}
            return module.group_of(node) if roles == {EVALUATOR} else None
        return None

    def _delays(self, uses: tuple[Use, ...], group: str, nodes: list, n: int) -> Value:
        """A chain of `staleness` delays; the delayed values live on the consumer's group."""
        current = uses
        for step in range(self.staleness):
            leaves = tuple(u.type.replace(group=group) for u in current)
            value = Value(f"stale{n}" + (f"_{step}" if self.staleness > 1 else ""),
                          TreeType.of(tuple(t.struct() for t in leaves)).with_leaves(leaves))
            nodes.append(Delay(inputs=tuple(current), initial=tuple(uses), outputs=(value,)))
            current = value.uses()
        return value


def _rewire(inputs: tuple[Use, ...], stale: list[bool], value: Value) -> tuple[Use, ...]:
    out, k = [], 0
    for u, s in zip(inputs, stale):
        if s:
            out.append(Use(value, k))
            k += 1
        else:
            out.append(u)
    return tuple(out)
