"""insert_delays{staleness}: actors read the learner's parameters `staleness` iterations late.

Every operand of an actor fragment that is a state leaf whose next value comes
from another device group goes through `staleness` `delay` nodes. Rollout k+1
then no longer waits for learn k, so the two overlap; the reference
interpreter reproduces the delays exactly (`fragc.ir.interpreter.run_iterations`).
So do the operands of a region on one group that runs evaluator fragments only
(evaluation episodes, src/fragc/algos/evaluation.py, under `lax.cond`): an evaluation acts
with the parameters the actors act with, and the actors' devices, which run it,
need not wait for the learner either.
"""

from __future__ import annotations

import dataclasses

from fragc.ir.errors import FragcError
from fragc.ir.module import REGION_KINDS, Delay, FragmentDef, Module, Node, Run, Use, Value, walk
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
            raise FragcError(_nothing_to_pipeline(module, self.role))
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


def _nothing_to_pipeline(module: Module, role: str) -> str:
    """Why no `role` run reads state that another device group updates, naming the user's fragments and lines."""
    fragments = [f for f in module.fragments.values() if f.role == role]
    if not fragments:
        found = ", ".join(f"@{f.name} ({f.role}, {f.source})" for f in module.fragments.values())
        why = f"it has no '{role}' fragment (its fragments: {found})"
    else:
        why = "; ".join(_why_not_delayed(module, f) for f in fragments)
    return (f"insert_delays: nothing to pipeline in {module.name}: {why}. A pipelined policy hands an '{role}' "
            f"fragment called at the iteration's top level the state that another device group updates, one "
            f"iteration late, so that the two overlap: have one read such state there, or use a synchronous policy "
            f"such as actor_learner")


def _why_not_delayed(module: Module, fdef: FragmentDef) -> str:
    """Where `fdef` runs: only inside regions (which delays do not enter), or at the top reading no such state."""
    where = f"@{fdef.name} (defined at {fdef.source})"
    if any(isinstance(n, Run) and n.fragment == fdef.name for n in module.graph.nodes):
        return f"{where} reads no state that another device group updates"
    regions = [f"the {n.kind} at {n.source}" for n in module.graph.nodes if isinstance(n, REGION_KINDS)
               and any(isinstance(m, Run) and m.fragment == fdef.name for g in n.regions for m in walk(g.nodes))]
    return f"{where} runs only inside {', '.join(regions) or 'no node'}"


def _rewire(inputs: tuple[Use, ...], stale: list[bool], value: Value) -> tuple[Use, ...]:
    out, k = [], 0
    for u, s in zip(inputs, stale):
        if s:
            out.append(Use(value, k))
            k += 1
        else:
            out.append(u)
    return tuple(out)
