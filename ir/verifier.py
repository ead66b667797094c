"""Structural checks of a module; every error names the node at fault."""

from __future__ import annotations

from typing import Any

from .errors import VerifyError
from .module import Glue, Module, Run, Use, Value
from .types import LeafType


def verify(module: Module) -> Module:
    """Raise `VerifyError` naming the node and stage; return the module unchanged."""
    graph = module.graph
    defined: set[Value] = set(graph.inputs)
    for i, node in enumerate(graph.nodes):
        where = f"{module.stage}: node {i} ({_describe(node)})"
        _check_uses(where, node.inputs, defined)
        for value in node.outputs:
            if value in defined:
                raise VerifyError(f"{where}: value %{value.name} is defined twice")
            defined.add(value)
        if isinstance(node, Run):
            _check_run(where, module, node)
        elif isinstance(node, Glue):
            _check_glue(where, node)
    _check_uses(f"{module.stage}: return", graph.outputs, defined)
    n_state = graph.out_tree.children()[0].num_leaves
    state_in = graph.inputs[0].type.leaves
    state_out = [u.type for u in graph.outputs[:n_state]]
    if [_sig(t) for t in state_in] != [_sig(t) for t in state_out[: len(state_in)]]:
        raise VerifyError(f"{module.stage}: return: the returned state's types differ from the input state's")
    return module


def _describe(node: Any) -> str:
    name = f" @{node.fragment}" if isinstance(node, Run) else ""
    outs = ", ".join(f"%{v.name}" for v in node.outputs)
    return f"{node.kind}{name} -> {outs}"


def _sig(t: LeafType) -> tuple:
    return (tuple(t.shape), str(t.dtype))


def _check_uses(where: str, uses: tuple[Use, ...], defined: set[Value]) -> None:
    for use in uses:
        if use.value not in defined:
            raise VerifyError(f"{where}: uses %{use.value.name} before it is defined")
        if not 0 <= use.index < len(use.value.type.leaves):
            raise VerifyError(f"{where}: leaf {use.index} of %{use.value.name} does not exist")


def _check_run(where: str, module: Module, node: Run) -> None:
    fdef = module.fragments.get(node.fragment)
    if fdef is None:
        raise VerifyError(f"{where}: fragment @{node.fragment} is not defined")
    expected = fdef.in_leaf_types
    if len(node.inputs) != len(expected):
        raise VerifyError(f"{where}: {len(node.inputs)} operands, but @{fdef.name} takes {len(expected)} leaves")
    for k, (use, t) in enumerate(zip(node.inputs, expected)):
        if _sig(use.type) != _sig(t):
            raise VerifyError(f"{where}: operand {k} is {use.type}, but @{fdef.name} expects {t}")
        if (module.attrs.get("transfers_inserted") and fdef.placement and use.type.group
                and use.type.group != fdef.placement.group):
            raise VerifyError(
                f"{where}: operand {k} lives on @{use.type.group}, but @{fdef.name} runs on @{fdef.placement.group}"
            )
    if [len(v.type.leaves) for v in node.outputs] != [len(t.leaves) for t in fdef.out_types]:
        raise VerifyError(f"{where}: results do not match @{fdef.name}'s result types")
    if fdef.placement:
        n = fdef.batch_length()
        if n is not None and n % fdef.placement.replicas:
            raise VerifyError(f"{where}: batch axis of length {n} does not divide by {fdef.placement.replicas} replicas")


def _check_glue(where: str, node: Glue) -> None:
    jaxpr = node.body.jaxpr
    if len(jaxpr.invars) != len(node.inputs):
        raise VerifyError(f"{where}: {len(node.inputs)} operands for a body of {len(jaxpr.invars)} inputs")
    for k, (use, var) in enumerate(zip(node.inputs, jaxpr.invars)):
        if _sig(use.type) != _sig(LeafType.of(var.aval)):
            raise VerifyError(f"{where}: operand {k} is {use.type}, but the glue body expects {LeafType.of(var.aval)}")
    if len(node.outputs) != 1 or len(node.outputs[0].type.leaves) != len(jaxpr.outvars):
        raise VerifyError(f"{where}: glue must define one value with one leaf per body output")
