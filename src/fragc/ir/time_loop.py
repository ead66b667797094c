"""A fragment's time loop split around its host step: what a host loop runs (src/fragc/runtime/host_loop.py).

A rollout that steps host environments is a `lax.scan` over time whose body
computes the actions on the device, calls the host step (src/fragc/ir/host.py), and
absorbs the observations. Run as one XLA program, every step is a Python
callback from inside XLA and nothing overlaps. A *host loop* runs the scan
from Python instead, one device program per half step:

    prefix:  the fragment's inputs -> the scan's operands (+ what the suffix reads)
    infer:   (consts, carry, x_t) -> (the host step's operands, residuals)      # device
    host:    the host step itself                                              # host CPU
    absorb:  (residuals, the host step's results) -> (carry, y_t)              # device
    suffix:  (what the prefix kept, the scan's results) -> the fragment's results

With G environment groups the environments of each replica are split into G
groups that run the loop independently (the infer and absorb programs are the
body traced for G times as many replicas), so inference for one group runs
while the host steps another: Sample Factory's double buffering, SRL's env
ring. A group's step depends only on its own environments, so the numbers
are the synchronous ones; the split is found by tracing the body for R and for
R*G replicas and comparing the scan's operand shapes (a leaf whose shape does
not change is the same in every group).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from jax.extend import core as jex

from .errors import FragcError
from .graph_builder import call_site
from .jax_compat import scan_counts
from .host import is_host_call
from .module import FragmentDef

COLLECTIVES = {"psum", "pmax", "pmin", "ppermute", "all_gather", "all_to_all", "axis_index", "psum_scatter",
               "reduce_scatter", "pbroadcast", "psum_invariant"}
"""Primitives that read other replicas: a step body with one cannot be split into environment groups."""


@dataclasses.dataclass(frozen=True, eq=False)
class TimeLoop:
    """A fragment body (per replica) split around the host step of its time loop.

    Group axes are per leaf, in per-replica coordinates (`xs` and `ys` with their leading time
    axis): the axis the environment groups split, or None for a leaf equal in every group.
    """

    name: str  # the host step's name
    prefix: jex.ClosedJaxpr  # fragment inputs -> consts + carry + xs + kept
    infer: jex.ClosedJaxpr  # consts + carry + x_t -> host operands + residuals
    callback: Callable[..., Any]  # host operands -> host results (numpy), with leading axes
    result_avals: tuple[Any, ...]
    call: jex.ClosedJaxpr  # host operands -> host results: the host step's one equation
    absorb: jex.ClosedJaxpr  # residuals + host results -> carry + y_t
    suffix: jex.ClosedJaxpr  # kept + carry + ys -> fragment outputs
    length: int
    reverse: bool
    num_consts: int
    num_carry: int
    num_xs: int
    num_operands: int  # of the host step
    # with one group, both hold the axes two groups would split (where the environments are), None if unknown
    group_axes: tuple[int | None, ...]  # consts + carry + xs
    ys_group_axes: tuple[int | None, ...]
    step_group_axes: tuple[int | None, ...]  # infer's results (host operands + residuals), then the host results


def split_time_loop(fdef: FragmentDef, replicas: int, groups: int) -> TimeLoop:
    """Split `fdef`'s body (traced for `replicas` replicas) around its host step, for `groups` groups."""
    body = fdef.body_for(replicas)
    s, scan = _host_scan(fdef, body)
    p = scan.params
    nc, nk = scan_counts(scan)
    gscan = _host_scan(fdef, fdef.body_for(replicas * groups))[1] if groups > 1 else scan
    step = gscan.params["jaxpr"]
    c, call = _host_call(fdef, step.jaxpr)
    if groups > 1:
        _refuse_collectives(fdef, step.jaxpr, groups)
        axes, ys_axes = _group_axes(fdef, scan, gscan, groups)
        step_axes = _step_group_axes(fdef, scan, gscan, groups)
    else:  # where two groups would split: the environments' axes, for the trajectory's layout (src/fragc/runtime/host_loop.py)
        try:
            two = _host_scan(fdef, fdef.body_for(replicas * 2))[1]
            axes, ys_axes = _group_axes(fdef, scan, two, 2, probe=True)
            step_axes = _step_group_axes(fdef, scan, two, 2)
        except FragcError:  # too few environments to tell: every leaf as if equal in every group
            axes, ys_axes = (None,) * len(scan.invars), (None,) * (len(scan.outvars) - nk)
            step_axes = (None,) * len(_step_avals(fdef, scan))
    prefix, kept = _prefix(body, s)
    infer, absorb = _split_step(step, c)
    return TimeLoop(
        name=call.params["callback"].callback_func.name, prefix=prefix, infer=infer,
        callback=call.params["callback"], result_avals=tuple(v.aval for v in call.outvars),
        call=_closed("host", [], [], list(call.invars), [call], list(call.outvars)), absorb=absorb,
        suffix=_suffix(body, s, kept), length=int(p["length"]), reverse=bool(p["reverse"]), num_consts=nc,
        num_carry=nk, num_xs=len(scan.invars) - nc - nk, num_operands=len(call.invars),
        group_axes=axes, ys_group_axes=ys_axes, step_group_axes=step_axes)


def _step_avals(fdef: FragmentDef, scan: Any) -> list[Any]:
    """The avals of what crosses the host step in the time loop `scan`: infer's results, then the host results."""
    step = scan.params["jaxpr"]
    c, call = _host_call(fdef, step.jaxpr)
    infer, _ = _split_step(step, c)
    return list(infer.out_avals) + [v.aval for v in call.outvars]


def _step_group_axes(fdef: FragmentDef, scan: Any, gscan: Any, groups: int) -> tuple[int | None, ...]:
    """The axis `groups` groups split of each value crossing the host step (`_step_avals`), as `_group_axes`;
    None where the two traces do not line up leaf for leaf or a leaf does not split along one axis."""
    whole, part = _step_avals(fdef, scan), _step_avals(fdef, gscan)
    if len(whole) != len(part):
        return (None,) * len(whole)
    axes = []
    for a, b in zip(whole, part):
        try:
            axes.append(_group_axis(fdef, a, b, groups))
        except FragcError:
            axes.append(None)
    return tuple(axes)


def _group_axes(fdef: FragmentDef, scan: Any, gscan: Any, groups: int, probe: bool = False) -> tuple[tuple, tuple]:
    """The axis `groups` groups split of each operand (consts + carry + xs) and each per-step output of the time
    loop `scan` (traced for R replicas), found against the same loop `gscan` traced for R * `groups`. A `probe`
    (one group: where two would split) takes any output that has no such axis, computed from the environments
    or not."""
    nc, nk = scan_counts(scan)
    axes = tuple(_group_axis(fdef, a.aval, b.aval, groups) for a, b in zip(scan.invars, gscan.invars))
    ys_axes = tuple(_group_axis(fdef, a.aval, b.aval, groups) for a, b in zip(scan.outvars[nk:], gscan.outvars[nk:]))
    for i in range(nc, nc + nk):  # a carried leaf keeps its split
        if axes[i] != _group_axis(fdef, scan.outvars[i - nc].aval, gscan.outvars[i - nc].aval, groups):
            raise FragcError(f"fragment '{fdef.name}': carried leaf {i - nc} of its time loop changes how it "
                             "is split between environments; it cannot run as a host loop")
    if not probe:
        step = gscan.params["jaxpr"].jaxpr
        _refuse_reductions(fdef, step, axes, axes[nc:nc + nk] + ys_axes, nk, groups)
        _refuse_operations_across_environments(fdef, scan.params["jaxpr"].jaxpr, step, nk, groups)
    return axes, ys_axes


def _refuse_reductions(fdef: FragmentDef, step: Any, in_axes: tuple, out_axes: tuple, num_carry: int,
                       groups: int) -> None:
    """A step output that no group splits must be the same in every group (groups take group 0's): refuse
    one that reads the environments (a mean reward over them, say), which each group computes over its own.
    Conservative: an output of an equation that reads anything computed from the environments reads them.
    A computation across environments whose result keeps their axis is `_refuse_operations_across_environments`'s."""
    split = {v for v, axis in zip(step.invars, in_axes) if axis is not None}
    for eqn in step.eqns:
        if any(isinstance(v, jex.Var) and v in split for v in eqn.invars):
            split.update(_vars(eqn.outvars))
    for i, (v, axis) in enumerate(zip(step.outvars, out_axes)):
        if axis is None and isinstance(v, jex.Var) and v in split:
            what = f"carried leaf {i}" if i < num_carry else f"per-step output {i - num_carry}"
            raise FragcError(f"fragment '{fdef.name}': {what} of its time loop is computed from the environments "
                             f"but has no environment axis (a sum or mean over them?), so {groups} environment "
                             "groups would each compute their own: use env_groups=1, or keep per-environment "
                             "values in the loop and reduce them after it")


def _refuse_operations_across_environments(fdef: FragmentDef, whole: Any, part: Any, num_carry: int,
                                           groups: int) -> None:
    """Refuse a step output computed by an operation across the environments even where it keeps their axis
    (observations centred on their mean over the environments, say): each group would compute it over its own.

    The step traced for one replica (`whole`) and for one of its groups (`part`) line up equation for equation;
    where a value has the environment axis is where their shapes differ (`_group_axis`). An operation across the
    environments is one that makes, from values with that axis, a value without it (a reduction, a contraction,
    picking one environment), or one that runs along it (a cumulative sum, a sort, a reversal, a concatenation).
    Where the traces stop lining up, nothing more is told."""
    mixed = _across(fdef, whole, part, groups)
    for i, v in enumerate(part.outvars):
        if isinstance(v, jex.Var) and v in mixed:
            what = f"carried leaf {i}" if i < num_carry else f"per-step output {i - num_carry}"
            eqn = mixed[v]
            raise FragcError(f"fragment '{fdef.name}': {what} of its time loop is computed by an operation across "
                             f"the environments ({eqn.primitive.name} along their axis, at {call_site(eqn)}), so "
                             f"{groups} environment groups would each compute it over their own: use env_groups=1, "
                             "or do that work after the time loop")


ALONG = {"cumsum": "axis", "cumprod": "axis", "cummax": "axis", "cummin": "axis", "cumlogsumexp": "axis",
         "sort": "dimension", "concatenate": "dimension", "rev": "dimensions"}
"""Primitives that run along one of their operand's axes, keeping it, and the parameter that names it."""


def _across(fdef: FragmentDef, whole: Any, part: Any, groups: int, env: dict | None = None) -> dict[Any, Any]:
    """The variables of `part` (one group's step) computed across the environments, each with the equation that
    did it; `env`: where `part`'s inputs have the environment axis (from the shapes by default)."""
    axis = {}
    for w, p in zip(whole.invars, part.invars):
        axis[p] = env[p] if env is not None and p in env else _axis_of(fdef, w, p, groups)
    mixed: dict[Any, Any] = {}
    if len(whole.eqns) != len(part.eqns):
        return mixed
    for we, pe in zip(whole.eqns, part.eqns):
        if we.primitive is not pe.primitive:
            return mixed
        ins = [v for v in pe.invars if isinstance(v, jex.Var)]
        source = next((mixed[v] for v in ins if v in mixed), None)
        outs = _vars(pe.outvars)
        if source is not None:
            mixed.update((o, source) for o in outs)
            continue
        if all(axis.get(v) is None for v in ins):
            continue
        out_axes = {o: _axis_of(fdef, w, o, groups) for w, o in zip(we.outvars, pe.outvars) if o in outs}
        along = ALONG.get(pe.primitive.name)
        runs_along = along is not None and any(
            axis.get(v) is not None and axis[v] in _dims(pe.params.get(along)) for v in ins)
        if runs_along or any(a is None for a in out_axes.values()):
            mixed.update((o, pe) for o in outs)
            continue
        axis.update(out_axes)
        inner = [(w, p) for w, p in zip(jex.jaxprs_in_params(we.params), jex.jaxprs_in_params(pe.params))]
        if len(inner) == 1 and len(inner[0][1].invars) == len(pe.invars):  # a call: what it computes across
            sub = _across(fdef, *inner[0], groups, {i: axis.get(v) for i, v in zip(inner[0][1].invars, pe.invars)
                                                    if isinstance(v, jex.Var)})
            mixed.update((o, sub[r]) for o, r in zip(pe.outvars, inner[0][1].outvars)
                         if isinstance(r, jex.Var) and r in sub and o in outs)
    return mixed


def _axis_of(fdef: FragmentDef, whole: Any, part: Any, groups: int) -> int | None:
    """Where a value has the environment axis (None: nowhere, or not as one axis split by the groups)."""
    try:
        return _group_axis(fdef, getattr(whole, "aval", whole), getattr(part, "aval", part), groups)
    except FragcError:
        return None


def _dims(value: Any) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


PARTS = ("infer", "env_step", "absorb")
"""The fragments `lower_host_loops` cuts a host loop's step into, named `{fragment}.{part}`."""


def time_loop_error(fdef: FragmentDef, replicas: int, groups: int) -> str | None:
    """Why `fdef` cannot run as a host loop with `groups` environment groups per replica (None if it can)."""
    try:
        split_time_loop(fdef, replicas, groups)
    except FragcError as err:
        return str(err)
    return None


# ---------------------------------------------------------------- finding the host step


def _anywhere(eqn: Any, found: Callable[[Any], bool]) -> bool:
    """Whether `found(eqn)`, or `found` of an equation in a jaxpr nested in `eqn`, at any depth."""
    return found(eqn) or any(_anywhere(e, found) for j in jex.jaxprs_in_params(eqn.params) for e in j.eqns)


def _is_collective(eqn: Any) -> bool:
    return eqn.primitive.name in COLLECTIVES


def _host_scan(fdef: FragmentDef, body: jex.ClosedJaxpr) -> tuple[int, Any]:
    """(index, eqn) of the top-level scan whose body makes the host step."""
    found = [(i, e) for i, e in enumerate(body.jaxpr.eqns) if _anywhere(e, is_host_call)]
    if len(found) != 1 or found[0][1].primitive.name != "scan":
        raise FragcError(f"fragment '{fdef.name}': a host loop needs exactly one host step, made directly in "
                         "the body of a lax.scan at the fragment's top level (the time loop); this body has "
                         f"{len(found)} top-level equation(s) holding host steps"
                         + (f" ({found[0][1].primitive.name})" if len(found) == 1 else "")
                         + ": pass env_groups=0 to run the host step inside the compiled program")
    return found[0]


def _host_call(fdef: FragmentDef, step: Any) -> tuple[int, Any]:
    calls = [(i, e) for i, e in enumerate(step.eqns) if is_host_call(e)]
    nested = any(_anywhere(e, is_host_call) for e in step.eqns if not is_host_call(e))
    if len(calls) != 1 or nested:
        raise FragcError(f"fragment '{fdef.name}': a host loop needs exactly one host step directly in its time "
                         f"loop's body, found {len(calls)}{' and more nested deeper' if nested else ''}: pass "
                         "env_groups=0 to run the host step inside the compiled program")
    return calls[0]


def _refuse_collectives(fdef: FragmentDef, step: Any, groups: int) -> None:
    for eqn in step.eqns:
        if _anywhere(eqn, _is_collective):
            raise FragcError(f"fragment '{fdef.name}': its time loop's body reads other replicas "
                             f"({eqn.primitive.name}), so its environments cannot be split into {groups} groups; "
                             "use env_groups=1")


def _group_axis(fdef: FragmentDef, whole: Any, part: Any, groups: int) -> int | None:
    """The axis of a leaf (shape `whole` per replica, `part` per group) that the groups split."""
    a, b = tuple(getattr(whole, "shape", ())), tuple(getattr(part, "shape", ()))
    if a == b:
        return None
    diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(a) != len(b) or len(diff) != 1 or a[diff[0]] != b[diff[0]] * groups:
        raise FragcError(f"fragment '{fdef.name}': a leaf of its time loop is {a} per replica but {b} with "
                         f"{groups} environment groups; only one axis may split, by {groups}")
    return diff[0]


# ---------------------------------------------------------------- cutting jaxprs


def _vars(atoms: Any) -> list[Any]:
    return [v for v in atoms if isinstance(v, jex.Var) and not isinstance(v, jex.DropVar)]


def _fresh(outvars: Any) -> list[Any]:
    """Outputs as binders (a dropped output gets a variable of its own)."""
    return [jex.Var(v.aval) if isinstance(v, jex.DropVar) else v for v in outvars]


def _closed(name: str, constvars: list, consts: list, invars: list, eqns: list, outvars: list) -> jex.ClosedJaxpr:
    effects = set().union(*(e.effects for e in eqns)) if any(e.effects for e in eqns) else jex.no_effects
    info = jex.DebugInfo(name, "fragc", tuple(f"in{i}" for i in range(len(invars))),
                         tuple(f"out{i}" for i in range(len(outvars))))
    return jex.ClosedJaxpr(jex.Jaxpr(constvars=constvars, invars=invars, outvars=outvars, eqns=eqns,
                                     effects=effects, debug_info=info), consts)


def _read_later(eqns: list, outvars: list, defined: set) -> list[Any]:
    """The variables of `defined` that `eqns` or `outvars` read, each once, in order of first read."""
    seen: dict[Any, None] = {}
    for v in [v for e in eqns for v in e.invars] + list(outvars):
        if isinstance(v, jex.Var) and v in defined:
            seen.setdefault(v, None)
    return list(seen)


def _prefix(body: jex.ClosedJaxpr, s: int) -> tuple[jex.ClosedJaxpr, list[Any]]:
    j = body.jaxpr
    eqns = list(j.eqns[:s])
    defined = set(j.constvars) | set(j.invars) | {v for e in eqns for v in _vars(e.outvars)}
    kept = _read_later(list(j.eqns[s + 1:]), list(j.outvars), defined)
    scan = j.eqns[s]
    return _closed("prefix", list(j.constvars), list(body.consts), list(j.invars), eqns,
                   list(scan.invars) + kept), kept


def _suffix(body: jex.ClosedJaxpr, s: int, kept: list[Any]) -> jex.ClosedJaxpr:
    j = body.jaxpr
    return _closed("suffix", [], [], kept + _fresh(j.eqns[s].outvars), list(j.eqns[s + 1:]), list(j.outvars))


def _split_step(step: jex.ClosedJaxpr, c: int) -> tuple[jex.ClosedJaxpr, jex.ClosedJaxpr]:
    j = step.jaxpr
    before, call, after = list(j.eqns[:c]), j.eqns[c], list(j.eqns[c + 1:])
    defined = set(j.constvars) | set(j.invars) | {v for e in before for v in _vars(e.outvars)}
    residuals = _read_later(after, list(j.outvars), defined)
    infer = _closed("infer", list(j.constvars), list(step.consts), list(j.invars), before,
                    list(call.invars) + residuals)
    absorb = _closed("absorb", [], [], residuals + _fresh(call.outvars), after, list(j.outvars))
    return infer, absorb
