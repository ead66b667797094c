"""Bytes that cross devices per iteration (collectives inside fragments, transfers between groups, host steps),
the kernel launches a GPU would make for a compiled program, estimated from its optimised HLO (`hlo_launches`),
and the model of seconds per iteration that `policy="auto"` ranks its candidates by (`predict`, below).

Collective bytes are what one device receives per iteration from the
collectives over `replica` in a shard_map fragment's per-replica body (a
rule per primitive below), multiplied by the trip counts of the scans around
it. For `jit` (GSPMD) fragments XLA chooses the collectives; their payload is
read from the optimised HLO, each instruction counted once (loop trip counts
unknown there).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Sequence

import numpy as np
from jax.extend import core as jex

from fragc.ir.module import (
    REPLICA, Delay, FragmentDef, HostLoop, Module, Run, Transfer, crosses_to_the_host, walk_counted,
)
from fragc.ir.types import LeafType

from .lower import leaf_sharding
from .stages import region_stages

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
    return round(jaxpr_collective_bytes(fdef.body_for(p.replicas).jaxpr, p.replicas))


def jaxpr_collective_bytes(jaxpr: Any, replicas: int, times: int = 1) -> float:
    """Bytes one device receives per run of a per-replica body from its collectives over `replica` (`_RECEIVED`'s
    rules), the scans around them counted."""
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in _RECEIVED and REPLICA in _axes(eqn):
            total += times * sum(_RECEIVED[name](LeafType.of(v.aval).nbytes, replicas) for v in eqn.invars)
            continue
        trips = int(eqn.params.get("length", 1)) if name == "scan" else 1
        for sub in jex.jaxprs_in_params(eqn.params):
            total += jaxpr_collective_bytes(sub, replicas, times * trips)
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


# ---------------------------------------------------------------- kernel launches, from optimised HLO

FREE_OPS = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
                      "add-dependency", "opt-barrier", "domain"})
"""Instructions that launch no kernel: names of buffers (a bitcast reinterprets one in place) and ordering tokens."""

_COMPUTATION = re.compile(r"^(?P<entry>ENTRY\s+)?%?(?P<name>[^\s(]+)\s+\(.*\{\s*$")
_HLO_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[^\s=]+\s*=\s*(?P<rest>.*)$")
_OPCODE = re.compile(r"^\s*(?P<op>[a-z][\w\-]*)\(")
_CALLED = re.compile(r"\b(?P<key>condition|body|to_apply|true_computation|false_computation)=%?(?P<name>[^\s,{}]+)")
_BRANCHES = re.compile(r"\bbranch_computations=\{(?P<names>[^}]*)\}")
_TRIP_COUNT = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(?P<n>\d+)')


def _skip_shape(rest: str) -> str:
    """What follows an instruction's result shape: a tuple shape `(...)` (nested, with `/*index=5*/` comments) or
    one array shape `f32[4,64]{1,0}`."""
    if not rest.startswith("("):
        return rest.split(" ", 1)[1] if " " in rest else ""
    depth = 0
    for i, c in enumerate(rest):
        depth += c == "("
        depth -= c == ")"
        if depth == 0:
            return rest[i + 1:]
    return ""


def _hlo_computations(hlo_text: str) -> tuple[dict[str, list[tuple[str, str]]], str | None]:
    """HLO text -> ({computation: [(opcode, the instruction's line)]}, the entry computation's name)."""
    comps: dict[str, list[tuple[str, str]]] = {}
    entry, current = None, None
    for line in hlo_text.splitlines():
        if current is None:
            header = _COMPUTATION.match(line)
            if header is not None and not line.startswith("HloModule"):
                current = header["name"]
                comps[current] = []
                entry = current if header["entry"] else entry
            continue
        if line.rstrip() == "}":  # a computation's end, in the first column
            current = None
            continue
        found = _HLO_INSTRUCTION.match(line)
        if found is None:
            continue
        op = _OPCODE.match(_skip_shape(found["rest"].strip()))
        if op is not None:
            comps[current].append((op["op"], line))
    return comps, entry


def hlo_launches(hlo_text: str, dispatch_trips: int | None = None) -> tuple[int, bool]:
    """An estimate of the kernels a GPU launches for one call of a program, read from its optimised HLO text
    (`compiled.as_text()`) -> (launches, exact).

    The method: each instruction of the entry computation, and of every computation it runs through control flow,
    is one launch, except those that launch nothing (`FREE_OPS`: parameters, constants, tuples and their elements,
    bitcasts) and the waiting half of an asynchronous pair (`*-done`, `*-update`; its `*-start` is the launch). A
    `fusion` is one launch (the instructions of its fused computation are not counted), as is every other unfused
    operation (dot, convolution, custom-call, copy, reduce, sort, scatter, gather, dynamic-update-slice, rng,
    collectives, and elementwise operations left unfused, which a GPU runs as a kernel each). Computations reached
    through control flow are counted in place of their instruction: a `call`'s once; a `while`'s body times the trip
    count XLA found (`"known_trip_count":{"n":...}` in its backend_config) -- with a known trip count XLA's GPU
    runtime runs the body that many times without evaluating the condition (its `WhileThunk`), so the condition is
    not counted; a `conditional`'s costliest branch. A loop whose trip count XLA does not know has its body and
    condition counted once and the estimate marked a lower bound (`exact` False).

    dispatch_trips: the trip count to take for the loops of unknown trip count that the entry computation runs
      directly (not inside such another loop, nor inside a branch): a fused program's dispatch loop on the CPU,
      which runs n <= k iterations with n an argument (src/fragc/runtime/fused.py). Given k, the loop's body counts k times and
      its condition not at all, as on a GPU, where that loop compiles with its trip count k; the count divided by k
      is then the iteration's (the dispatch loop's body) plus the entry's other work shared over k iterations.

    Limits: this is what a GPU would launch if its compiler made the same program as the one compiled here. Read
    from the CPU's optimised HLO, it is a proxy: XLA's GPU compiler fuses differently (more elementwise work into
    fewer, larger kernels; matrix products through cuBLAS or Triton, sometimes with a fused epilogue; reductions
    split in two), unrolls loops in its own way, and may capture kernels in CUDA graphs (command buffers), which
    changes what the host submits but not the kernels the device runs. Compare programs by it on the same backend,
    and check it against a GPU's compiled HLO (or a profile) where one is at hand. Memsets, host-device copies of a
    loop condition and a conditional's predicate are not counted."""
    comps, entry = _hlo_computations(hlo_text)
    if entry is None:  # not HLO text
        return 0, False
    memo: dict[tuple[str, bool], tuple[int, bool]] = {}

    def count(name: str, outer: bool) -> tuple[int, bool]:
        """Launches of one run of computation `name`; `outer`: whether `dispatch_trips` applies to its loops."""
        if name not in comps:  # a computation the text does not hold: nothing counted, so not exact
            return 0, False
        if (name, outer) in memo:
            return memo[(name, outer)]
        total, exact = 0, True
        for op, line in comps[name]:
            if op in FREE_OPS or op.endswith("-done") or op.endswith("-update"):
                continue
            called = {m["key"]: m["name"] for m in _CALLED.finditer(line)}
            if op == "while" and "body" in called:
                trips = _TRIP_COUNT.search(line)
                body, body_exact = count(called["body"], outer and trips is not None)
                if trips is not None:
                    total, exact = total + int(trips["n"]) * body, exact and body_exact
                elif outer and dispatch_trips is not None:
                    total, exact = total + dispatch_trips * body, exact and body_exact
                else:
                    cond, _ = count(called.get("condition", ""), False)
                    total, exact = total + body + cond, False
            elif op == "conditional":
                branches = _BRANCHES.search(line)
                names = ([b.strip().lstrip("%") for b in branches["names"].split(",") if b.strip()] if branches
                         else [called[k] for k in ("true_computation", "false_computation") if k in called])
                counted = [count(b, False) for b in names]
                total += max((c for c, _ in counted), default=0)
                exact = exact and all(e for _, e in counted)
            elif op == "call" and "to_apply" in called:
                sub, sub_exact = count(called["to_apply"], outer)
                total, exact = total + sub, exact and sub_exact
            else:
                total += 1
        memo[(name, outer)] = (total, exact)
        return total, exact

    return count(entry, True)


def transfer_bytes(module: Module) -> int:
    """Bytes the iteration's transfers between device groups move: a transfer in a loop's body every trip (in a
    branch: as if taken). A host loop's crossings to the host are the host steps' (`host_bytes`)."""
    return sum(n.nbytes * times for n, times in walk_counted(module.graph.nodes)
               if isinstance(n, Transfer) and not crosses_to_the_host(n))


def host_bytes(module: Module) -> tuple[int, int]:
    """Bytes (device -> host, host -> device) per iteration of the host steps (src/fragc/ir/host.py) in the fragments the
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


# ---------------------------------------------------------------- the model of `policy="auto"` (src/fragc/search/)
# Seconds per iteration of a placed, scheduled module, from its jaxprs and a machine's measured constants: no
# XLA compilation. The search (src/fragc/search/) measures the constants and ranks its candidates by `predict`.

def jaxpr_cost(jaxpr: Any, times: float = 1.0) -> dict[str, float]:
    """FLOPs (matrix products and convolutions), bytes read and written (every equation's operands and
    results, as if unfused), equations and loop trips, per call of `jaxpr`, a scan's body `length` times (XLA's own cost
    analysis counts a loop's body once), the costlier branch of a `cond`, a `while` body once."""
    out = {"flops": 0.0, "bytes": 0.0, "ops": 0.0, "trips": 0.0}
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        subs = list(jex.jaxprs_in_params(eqn.params))
        if subs:
            if name == "cond":
                costs = [jaxpr_cost(s, times) for s in subs]
                best = max(costs, key=lambda c: c["flops"] + c["bytes"])
                for key in out:
                    out[key] += best[key]
                continue
            trips = float(eqn.params.get("length", 1)) if name == "scan" else 1.0
            out["trips"] += times * trips if name in ("scan", "while") else 0.0
            for s in subs:
                sub = jaxpr_cost(s, times * trips)
                for key in out:
                    out[key] += sub[key]
            continue
        out["ops"] += times
        out["bytes"] += times * sum(_nbytes(v.aval) for v in list(eqn.invars) + list(eqn.outvars))
        if name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            k = int(np.prod([eqn.invars[0].aval.shape[d] for d in contract])) if contract else 1
            out["flops"] += times * 2.0 * k * _size(eqn.outvars[0].aval)
        elif name == "conv_general_dilated":
            rhs = eqn.invars[1].aval.shape
            out["flops"] += times * 2.0 * _size(eqn.outvars[0].aval) * int(np.prod(rhs)) / max(1, rhs[0])
    return out


def _size(aval: Any) -> int:
    return int(np.prod(getattr(aval, "shape", ()) or (1,)))


def _nbytes(aval: Any) -> int:
    dtype = getattr(aval, "dtype", None)
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:  # PRNG keys, tokens
        itemsize = 8
    return _size(aval) * itemsize if hasattr(aval, "shape") else 0


@dataclasses.dataclass
class Machine:
    """Constants of one device kind and count, measured once by micro-benchmarks (`measure_machine`)."""

    flops_per_s: float  # matrix products, one device
    bytes_per_s: float  # unfused operand + result bytes, one device (as `jaxpr_cost` counts them)
    speedup: dict  # group size (str) -> how much faster g devices run g equal shares than one device runs one
    trip_s: dict  # group size (str) -> seconds per loop trip of a program on g devices
    collective_s: dict  # group size (str) -> seconds per collective call over g devices (its latency)
    dispatch_s: float  # one dispatch of a program and the fetch of its result (per dispatch)
    call_s: float  # queuing one more program call (per stage call of a staged iteration)
    collective_bytes_per_s: float  # bytes one device receives from a psum, per second
    transfer_bytes_per_s: float  # device_put between devices
    host_call_s: float  # one round trip device -> host -> device
    # what fragc's runtime pays per dispatch beyond `dispatch_s`, measured on tiny fragc programs
    dispatch_leaf_s: float = 0.0  # per leaf of the state (the program's arguments, donated, and results)
    dispatch_metric_s: float = 0.0  # per metric (its rows fetched to the host and sliced)
    # a staged schedule's fixed costs, per group size (str) of the stage or of the transfer's destination
    stage_call_s: dict = dataclasses.field(default_factory=dict)  # one stage program's launch
    stage_leaf_s: dict = dataclasses.field(default_factory=dict)  # each argument leaf of that launch
    put_leaf_s: dict = dataclasses.field(default_factory=dict)  # one leaf's device_put between groups

    def parallel(self, g: int) -> float:
        return _by_size(self.speedup, g, 1.0)

    def trip(self, g: int) -> float:
        return _by_size(self.trip_s, g, 0.0)

    def collective(self, g: int) -> float:
        return _by_size(self.collective_s, g, 0.0) if g > 1 else 0.0

    def stage_call(self, g: int) -> float:
        return _by_size(self.stage_call_s, g, self.call_s)

    def stage_leaf(self, g: int) -> float:
        return _by_size(self.stage_leaf_s, g, 0.0)

    def put_leaf(self, g: int) -> float:
        return _by_size(self.put_leaf_s, g, 0.0)


def _by_size(table: dict, g: int, default: float) -> float:
    """The entry of group size g, else the nearest measured size below it."""
    if str(g) in table:
        return float(table[str(g)])
    below = [v for k, v in sorted((int(k), v) for k, v in table.items()) if k <= g]
    return float(below[-1]) if below else default


_FRAGMENT_COSTS: dict[tuple, dict] = {}


def _fragment_cost(fdef: Any) -> dict[str, float]:
    """`jaxpr_cost` of a fragment's body at global shapes, cached by name and types (candidates share it)."""
    body = fdef.body
    key = (fdef.name, str(body.in_avals), str(body.out_avals), len(body.jaxpr.eqns))
    if key not in _FRAGMENT_COSTS:
        _FRAGMENT_COSTS[key] = jaxpr_cost(body.jaxpr)
    return _FRAGMENT_COSTS[key]


_COLLECTIVES: dict[tuple, tuple] = {}


def _collectives(fdef: Any, group_size: int) -> tuple[float, float]:
    """(bytes one device receives, collective calls) per run of the fragment (src/fragc/runtime/cost.py's rules); for
    a `jit` fragment, as if it ran one replica per device of its group (XLA's own choice is not visible
    before compiling)."""
    r = fdef.placement.replicas if fdef.placement.lowering == "shard_map" else group_size
    if r <= 1:
        return 0.0, 0.0
    key = (fdef.name, str(fdef.body.in_avals), r)
    if key not in _COLLECTIVES:
        try:
            body = fdef.body_for(r).jaxpr
            _COLLECTIVES[key] = (float(jaxpr_collective_bytes(body, r)), float(collective_calls(body)))
        except Exception:  # an axis that does not divide: XLA still partitions it; count nothing
            _COLLECTIVES[key] = (0.0, 0.0)
    return _COLLECTIVES[key]


def predict(module: Any, machine: Machine, k: int) -> dict[str, float]:
    """Seconds per iteration of a placed, scheduled module with `k` iterations a dispatch, by term.

    compute: each fragment run's serial time (FLOPs / F + bytes / B, the work of all replicas and
      population members) over the speedup of its group's size, plus its loop trips x the cost of a trip on
      that many devices; groups in sequence, or, with staleness (actor_learner_async), overlapped (the
      slowest group);
    collectives: bytes received per device / collective bandwidth + calls x a call's latency on the group;
    transfers: bytes / transfer bandwidth, plus (staged) each leaf's device_put latency on its destination
      group, or (one program) a call each; host: the host steps' round trips and bytes (overlapped with
      inference with G >= 2);
    stages (staged only): each stage program's launch on its group, plus a cost per argument leaf;
    dispatch: one dispatch per k iterations: a base cost, plus one per state leaf and one per metric."""
    members = max(1, len(module.population))
    sizes = {m.name: len(m.devices) for m in module.meshes}
    group_s: dict[str, float] = {}
    coll = host = 0.0
    for node, times in walk_counted(module.graph.nodes):
        if not isinstance(node, (Run, HostLoop)):
            continue
        fdef = module.fragments[node.fragment]
        if fdef.part_of:
            continue
        g = sizes.get(fdef.placement.group, 1)
        c = _fragment_cost(fdef)
        serial = members * (c["flops"] / machine.flops_per_s + c["bytes"] / machine.bytes_per_s)
        compute = times * (serial / machine.parallel(g) + c["trips"] * machine.trip(g))
        nbytes, calls = _collectives(fdef, g)
        coll += times * (nbytes / machine.collective_bytes_per_s + calls * machine.collective(g))
        steps = sum(s.calls for s in fdef.host_steps)
        if steps:
            trip = machine.host_call_s * steps
            if isinstance(node, HostLoop):  # the time loop from the host: infer, step, absorb each step and group
                trip += 3 * machine.call_s * node.steps * node.groups
                if node.groups >= 2:  # inference of one group overlaps the host stepping of the other
                    both = max(compute, trip)
                    compute, trip = both, min(compute, trip) / node.groups
            host += times * trip
        group_s[fdef.placement.group] = group_s.get(fdef.placement.group, 0.0) + compute
    to_host, from_host = host_bytes(module)
    host += (to_host + from_host) / machine.transfer_bytes_per_s
    staged = module.schedule.executor == "staged"
    transfers = [(n, t) for n, t in walk_counted(module.graph.nodes)
                 if isinstance(n, Transfer) and not crosses_to_the_host(n)]  # a step's crossings are `host`
    transfer = transfer_bytes(module) / machine.transfer_bytes_per_s
    stages = 0.0
    if staged:  # each transfer is a device_put per leaf, each stage a program launched with its leaves
        transfer += sum(t * len(n.outputs[0].type.leaves) * machine.put_leaf(sizes.get(n.dst, 1))
                        for n, t in transfers)
        runs = [(s, 1) for s in module.stages] + [(s, t) for s, _, t in region_stages(module)]
        for s, t in runs:
            g = sizes.get(s.group, 1)
            stages += t * (machine.stage_call(g) + len(s.inputs) * machine.stage_leaf(g))
    else:  # inside the one program: a call's worth each
        transfer += sum(t for _, t in transfers) * machine.call_s
    overlapped = staged and any(isinstance(n, Delay) for n in module.graph.nodes)
    compute = max(group_s.values(), default=0.0) if overlapped else sum(group_s.values())
    leaves = len(module.graph.inputs[0].type.leaves)
    metrics = max(0, len(module.graph.outputs) - leaves)
    dispatch = (machine.dispatch_s + leaves * machine.dispatch_leaf_s + metrics * machine.dispatch_metric_s) / k
    total = compute + coll + transfer + host + stages + dispatch
    return {"compute": compute, "collectives": coll, "transfers": transfer, "host": host, "stages": stages,
            "dispatch": dispatch, "total": total}


def state_bytes_per_device(module: Any, devices: Sequence[Any]) -> int:
    """The most bytes of the training state that one device holds (a population's members included)."""
    members = (len(module.population),) if module.population else ()
    per: dict[Any, int] = {}
    for leaf in module.graph.inputs[0].type.leaves:
        shape = members + tuple(leaf.shape)
        sharding = leaf_sharding(leaf, module, devices)
        try:
            local = sharding.shard_shape(shape)
        except Exception:
            local = shape
        nbytes = int(np.prod(local or (1,))) * _itemsize(leaf.dtype)
        for d in sharding.device_set:
            per[d] = per.get(d, 0) + nbytes
    return max(per.values(), default=0)


def _itemsize(dtype: Any) -> int:
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        return 8
