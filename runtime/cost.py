"""Bytes that cross devices per iteration: collectives inside fragments, transfers between groups, host steps.

Collective bytes are what one device receives per iteration from the
collectives over `replica` in a shard_map fragment's per-replica body (a
rule per primitive below), multiplied by the trip counts of the scans around
it. For `jit` (GSPMD) fragments XLA chooses the collectives; their payload is
read from the optimised HLO, each instruction counted once (loop trip counts
unknown there).
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np
from jax.extend import core as jex

from fragc.ir.module import REPLICA, FragmentDef, Module, Transfer, walk_counted
from fragc.ir.types import LeafType

# Bytes one device receives, given the bytes n of its operand and the replica count R.
_RECEIVED: dict[str, Callable[[int, int], float]] = {
    "all_gather": lambda n, r: (r - 1) * n,  # every other replica's operand
    "all_to_all": lambda n, r: (r - 1) * n / r,  # one chunk from every other replica
    "psum_scatter": lambda n, r: (r - 1) * n / r,  # a ring reduce-scatter
    "psum": lambda n, r: 2 * (r - 1) * n / r,  # a ring all-reduce: reduce-scatter + all-gather
    "psum_invariant": lambda n, r: 2 * (r - 1) * n / r,
    "pmax": lambda n, r: 2 * (r - 1) * n / r,
    "pmin": lambda n, r: 2 * (r - 1) * n / r,
    "ppermute": lambda n, r: n,  # at most one operand from one other replica
}


def fragment_collective_bytes(fdef: FragmentDef) -> int:
    """Per iteration and device, for a shard_map fragment (0 with one replica: nothing crosses devices)."""
    p = fdef.placement
    if p is None or p.replicas == 1 or p.lowering != "shard_map":
        return 0
    return round(_jaxpr_bytes(fdef.body_for(p.replicas).jaxpr, p.replicas))


def _jaxpr_bytes(jaxpr: Any, replicas: int, times: int = 1) -> float:
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in _RECEIVED and REPLICA in _axes(eqn):
            total += times * sum(_RECEIVED[name](LeafType.of(v.aval).nbytes, replicas) for v in eqn.invars)
            continue
        trips = int(eqn.params.get("length", 1)) if name == "scan" else 1
        for sub in jex.jaxprs_in_params(eqn.params):
            total += _jaxpr_bytes(sub, replicas, times * trips)
    return total


def _axes(eqn: Any) -> tuple:
    axes = eqn.params.get("axes", eqn.params.get("axis_name", ()))
    return axes if isinstance(axes, tuple) else (axes,)


COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
"""XLA's collective instructions. Each may be combined (one instruction of tuple shape for several operands) or
asynchronous (`all-reduce-start` queues it, `all-reduce-done` waits for it and has the result's shape)."""

_INSTRUCTION = re.compile(r"= (?P<shape>[^=]+?) (?P<op>" + "|".join(COLLECTIVES) + r")(?:-done)?\(")
_ARRAY = re.compile(r"(\w+)\[([\d,]*)\]")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2,
          "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16}


def hlo_collective_bytes(hlo_text: str) -> int:
    """Payload of the collective instructions in optimised HLO, each counted once: a synchronous one by its result
    (every array of a combined one's tuple), an asynchronous one by its `-done` (its `-start`'s tuple also holds
    the operands and the collective's scratch)."""
    total = 0
    for line in hlo_text.splitlines():
        found = _INSTRUCTION.search(line)
        if found is None:
            continue
        for dtype, dims in _ARRAY.findall(found["shape"]):
            total += int(np.prod([int(d) for d in dims.split(",") if d])) * _BYTES.get(dtype, 4)
    return total


def transfer_bytes(module: Module) -> int:
    """Bytes the iteration's transfers move: a transfer in a loop's body every trip (in a branch: as if taken)."""
    return sum(n.nbytes * times for n, times in walk_counted(module.graph.nodes) if isinstance(n, Transfer))


def host_bytes(module: Module) -> tuple[int, int]:
    """Bytes (device -> host, host -> device) per iteration of the host steps (ir/host.py) in the fragments the
    iteration runs."""
    steps = [s for f in module.fragments.values() for s in f.host_steps]
    return sum(s.to_host for s in steps), sum(s.from_host for s in steps)


def collective_calls(jaxpr: Any, times: int = 1) -> int:
    """How many collectives over `replica` a per-replica body calls per run (the scans around them counted):
    on CPUs and small payloads their latency, not their bytes, is what they cost."""
    total = 0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in _RECEIVED and REPLICA in _axes(eqn):
            total += times
            continue
        trips = int(eqn.params.get("length", 1)) if name == "scan" else 1
        for sub in jex.jaxprs_in_params(eqn.params):
            total += collective_calls(sub, times * trips)
    return total
