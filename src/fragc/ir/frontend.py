"""The tracing frontend: `@fragment`, `pmean`/`psum`, and `trace(algo)`.

Called outside `trace`, a fragment is an ordinary JAX function with one
replica (the reference semantics with R = 1), so `jax.jit(algo.iteration)`
works as is. Inside `trace`, each call binds the `fragment_call` primitive, so
`jax.make_jaxpr(algo.iteration)` yields fragment calls and glue equations at
the top level, which `build_graph` turns into a `Module`.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import itertools
import inspect
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.extend import core as jex
from jax.interpreters import ad, batching

from . import sweep, traps
from .traps import caller, short_location
from .collectives import pmean, psum  # noqa: F401  (re-exported: `fragc.pmean`)
from .errors import FragcError, FragmentError
from .graph_builder import build_graph
from .host import find_host_steps
from .module import REPLICA, FragmentDef, Module
from .replicas import run_replicated
from .shared_keys import warn_shared_draws
from .types import NUMBERS, LeafType, TreeType, as_arrays

_TRACING: contextvars.ContextVar["_TraceContext | None"] = contextvars.ContextVar("fragc_trace", default=None)

_JIT_CACHE_SCOPE = jax.make_user_context(None)
"""Part of JAX's tracing-cache key (`jax.make_user_context`), set to the trace's id while `trace` runs. JAX caches
the jaxpr of a `jax.jit` of the user's own (a jitted method or helper that calls fragments) by function and
argument types; a fragc trace must neither reuse one traced outside fragc (its fragments ran as plain functions,
and would silently become glue) nor leave its own fragment calls for a later trace or `jax.jit` to find.
Fragment bodies trace in the trace's scope too. One scope for every trace's bodies (tried 2026-11-28: it saved the
`jax.numpy` jits' tracing, 8% of the test suite's time) reused a body's cached trace of the user's `jax.jit` after
what it closes over had changed (a global, a replaced config: results differing between `single` and `anakin`),
and after a plain run of the iteration let a fragment called inside another's body through as that body's code
(tests/test_trace_counts.py)."""

fragment_call_p = jex.Primitive("fragment_call")
fragment_call_p.multiple_results = True


def _fragment_call_abstract_eval(*avals: Any, fragment: str, trace_id: int) -> list[Any]:
    ctx = _TRACING.get()
    if ctx is None:
        raise FragcError(f"fragment '{fragment}' was bound outside fragc.trace")
    return list(ctx.defs_by_name[fragment].body.out_avals)


fragment_call_p.def_abstract_eval(_fragment_call_abstract_eval)


# ---------------------------------------------------------------- the decorator


def fragment(*, role: str, in_axes: Any = 0, out_axes: Any = 0,
             agent_axes: Any = None) -> Callable[[Callable[..., Any]], "Fragment"]:
    """Declare a fragment of an algorithm's iteration.

    role: which part of the algorithm this is (`actor`, `learner`, `buffer`, ...);
      policies place fragments by role.
    in_axes, out_axes: as in `jax.vmap`: per argument (result) the index of its
      environment (batch) axis, `None` for replicated values, or a pytree prefix.
      Axes count from the front (no negative axes: one entry may cover leaves of
      different ranks).
    agent_axes: `(in, out)`, declared like in_axes and out_axes: each argument's (result's) agent
      axis (multi-agent algorithms: agents stacked in a value, or parameters one per agent), `None`
      where it has none. A policy may split a fragment's replicas over its agent axes instead of
      its environment axes (`split="agent"`: independent agents' learners on devices of their own).

    Arguments are arrays; Python and NumPy numbers are taken as arrays, as `jax.jit`
    takes them. Any other value (a string, an enum member, a function, one in a dict)
    is bound into the body, as `jax.jit`'s static arguments are: a call with another
    value defines another fragment. Parameters left out take their defaults.
    """
    if not isinstance(role, str) or not role:
        raise FragmentError(f"fragment role must be a non-empty string, got {role!r}")
    if agent_axes is not None and not (isinstance(agent_axes, tuple) and len(agent_axes) == 2):
        raise FragmentError(f"fragment agent_axes is a pair (in, out) declared like in_axes and out_axes, got "
                            f"{agent_axes!r}")
    agent_in, agent_out = agent_axes if agent_axes is not None else (None, None)
    for what, axes in (("in_axes", in_axes), ("out_axes", out_axes), ("agent_axes", agent_in),
                       ("agent_axes", agent_out)):
        for axis in jax.tree.leaves(axes):
            if not isinstance(axis, int) or isinstance(axis, bool) or axis < 0:
                raise FragmentError(f"fragment {what} entries are axis indices from 0 (counted from the front: one "
                                    f"entry may cover leaves of different ranks) or None, got {axis!r}")
    return lambda fn: Fragment(fn, role, in_axes, out_axes, agent_axes)


class Fragment:
    """A function with a role and axis declarations; see `fragment`."""

    def __init__(self, fn: Callable[..., Any], role: str, in_axes: Any, out_axes: Any, agent_axes: Any = None):
        functools.update_wrapper(self, fn)
        self.fn, self.role, self.in_axes, self.out_axes = fn, role, in_axes, out_axes
        self.agent_axes = agent_axes
        self.name = _name(fn, role)

    def __get__(self, obj: Any, objtype: Any = None) -> "Fragment":
        if obj is None or not hasattr(self.fn, "__get__"):  # a functools.partial binds no `self`
            return self
        return Fragment(self.fn.__get__(obj, objtype), self.role, self.in_axes, self.out_axes, self.agent_axes)

    def __repr__(self) -> str:
        return f"<fragment {self.name} role={self.role}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if (sweeping := sweep.active()) is not None:  # the swept hyperparameters as one more argument
            bound = self._bind(args, kwargs)
            return sweeping[0].fragment(self, len(bound), SweptFragment)(*bound, sweeping[1])
        args = self._arguments(self._bind(args, kwargs))
        ctx = _TRACING.get()
        if ctx is not None and ctx.defining:
            raise FragmentError(f"fragment '{self.name}' is called inside fragment '{ctx.defining[-1]}' (at "
                                f"{caller()}); a fragment's body is one program on its own devices: call "
                                f"'{self.name}' from the iteration, or call a plain function inside '"
                                f"{ctx.defining[-1]}'")
        fdef = define(self, args) if ctx is None else ctx.define(self, args)
        leaves = jax.tree.leaves(args)
        if ctx is not None:
            # trace_id keeps JAX's abstract-eval cache (keyed by params and input types) from
            # answering for a same-named fragment of another trace whose outputs differ
            outs = fragment_call_p.bind(*leaves, fragment=fdef.name, trace_id=ctx.trace_id)
        else:
            body = fdef.body
            outs = run_replicated(
                lambda *xs: jex.jaxpr_as_fun(body)(*xs), leaves, fdef.in_axes, fdef.out_axes, 1, fdef.name
            )
        return jax.tree.unflatten(fdef.out_tree, outs)

    def _bind(self, args: tuple, kwargs: dict) -> tuple:
        """The arguments as Python binds them, positionally: keyword arguments in their parameters' places,
        defaults filled in for the parameters left out."""
        keywords = f" with keywords ({', '.join(kwargs)})" if kwargs else ""
        try:
            signature = inspect.signature(self.fn)
        except (TypeError, ValueError):  # a callable without a signature (a C function): its arguments as given
            if kwargs:
                raise FragmentError(f"fragment '{self.name}' called at {caller()}{keywords}: its signature is "
                                    "unknown; pass its arguments positionally") from None
            return args
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as err:
            raise FragmentError(f"fragment '{self.name}' called at {caller()}{keywords}: {err}") from None
        passed = set(bound.arguments)
        bound.apply_defaults()
        for name, param in signature.parameters.items():  # left out, a keyword-only one keeps its default itself
            if param.kind is param.KEYWORD_ONLY and name not in passed:  # (a functools.partial's keywords)
                del bound.arguments[name]
        if bound.kwargs:
            keyword_only = sorted(n for n in bound.kwargs if n in signature.parameters)
            into_var = sorted(n for n in bound.kwargs if n not in signature.parameters)  # gathered by **kwargs
            var = next((p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), "kwargs")
            kinds = ([f"keyword-only parameters ({', '.join(keyword_only)})"] if keyword_only else []) + (
                [f"**{var} arguments ({', '.join(into_var)})"] if into_var else [])
            raise FragmentError(f"fragment '{self.name}' called at {caller()}: {'; '.join(kinds)} cannot carry values "
                                "between fragments; make each a positional-or-keyword parameter")
        return tuple(bound.args)

    def _arguments(self, args: tuple) -> tuple:
        """The bound arguments as fragc traces them: numbers as arrays (constants of the graph), and every
        other leaf that is not an array (a string, an enum member, a function) as `Static`."""
        names = self.arg_names(len(args))

        def leaf(path: Any, x: Any) -> Any:
            if isinstance(x, NUMBERS) or (hasattr(x, "shape") and hasattr(x, "dtype")):
                return x
            try:
                hash(x)
            except TypeError:
                where = names[path[0].idx] + jax.tree_util.keystr(path[1:])
                raise FragmentError(
                    f"fragment '{self.name}', argument '{where}' (called at {caller()}): a {type(x).__name__} is "
                    "neither an array nor a hashable value; fragc binds a non-array argument into the body, as "
                    "jax.jit does a static argument, and tells its values apart by hash: pass arrays, or make it "
                    "hashable (a frozen dataclass, a tuple, a frozenset)") from None
            return Static(x)

        return as_arrays(jax.tree_util.tree_map_with_path(leaf, args))

    def arg_names(self, count: int) -> tuple[str, ...]:
        try:
            params = list(inspect.signature(self.fn).parameters.values())
        except (TypeError, ValueError):
            params = []
        names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return tuple(names[i] if i < len(names) else f"arg{i}" for i in range(count))


class SweptFragment(Fragment):
    """A fragment called under a hyperparameter sweep (src/fragc/ir/sweep.py): its last argument,
    `hyperparameters`, holds the member's values, and its body reads them through `self.config`."""

    def __init__(self, frag: Fragment, sweeping: "sweep.Sweep", nargs: int):
        @functools.wraps(frag.fn)
        def body(*args: Any) -> Any:
            with sweeping.values(args[-1]):
                return frag.fn(*args[:-1])

        in_axes = frag.in_axes if isinstance(frag.in_axes, tuple) else (frag.in_axes,) * nargs
        agent_axes = frag.agent_axes
        if agent_axes is not None:
            agent_in = agent_axes[0] if isinstance(agent_axes[0], tuple) else (agent_axes[0],) * nargs
            agent_axes = (agent_in + (None,), agent_axes[1])
        super().__init__(body, frag.role, in_axes + (None,), frag.out_axes, agent_axes)
        self.name, self.original = frag.name, frag

    def _bind(self, args: tuple, kwargs: dict) -> tuple:
        """The arguments the swept fragment bound (`Fragment.__call__`), and the values last."""
        return args

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with sweep.suspended():  # this call is the swept one
            return super().__call__(*args, **kwargs)

    def arg_names(self, count: int) -> tuple[str, ...]:
        return self.original.arg_names(count - 1) + ("hyperparameters",)


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class Static:
    """A leaf of a fragment's arguments that is not an array: a string, an enum member, a function. Like
    `jax.jit`'s static arguments it is bound into the body, not passed: it is a pytree node without leaves
    whose value is part of the arguments' treedef, so calls with another value define another fragment
    (`fit`, `fit_1`), and an argument that is all static is not an argument of the IR's fragment at all."""

    value: Any


def _unwrap_static(tree: Any) -> Any:
    """The user's values back in place of their `Static` wrappers, for the body."""
    return jax.tree.map(lambda x: x.value if isinstance(x, Static) else x, tree,
                        is_leaf=lambda x: isinstance(x, Static))


def _refuse_batching(args: Any, dims: Any, *, fragment: str, trace_id: int) -> Any:
    raise FragmentError(f"fragment '{fragment}' is called under a jax.vmap of your own, or a lax.map with a "
                        f"batch_size (which vmaps its batches) (at {caller()}); fragc vectorises fragments itself: "
                        "declare the batch axis in in_axes/out_axes, or vmap inside the fragment's body")


batching.primitive_batchers[fragment_call_p] = _refuse_batching


def _refuse_differentiation(primals: Any, tangents: Any, *, fragment: str, trace_id: int) -> Any:
    raise FragmentError(f"fragment '{fragment}' is differentiated from outside (jax.grad or jax.jvp around its call, "
                        f"at {caller()}); take gradients inside the fragment's body")


ad.primitive_jvps[fragment_call_p] = _refuse_differentiation


# ---------------------------------------------------------------- defining a fragment


def define(frag: Fragment, args: tuple, name: str | None = None) -> FragmentDef:
    """Check a call's arguments against the declarations and trace the body."""
    names = frag.arg_names(len(args))
    agent_in, agent_out = frag.agent_axes if frag.agent_axes is not None else (None, None)
    in_axes = _flat_axes(frag, frag.in_axes, args, names, "in_axes", "argument")
    in_agents = (_flat_axes(frag, agent_in, args, names, "agent_axes", "argument") if frag.agent_axes is not None
                 else [None] * len(in_axes))
    leaves, in_tree = jax.tree.flatten(args)
    in_leaf_types = [LeafType.of(x, a, g) for x, a, g in zip(leaves, in_axes, in_agents)]
    _check_axes(frag, in_leaf_types, args, names)
    body, out_tree, flat_fn = _trace_body(frag, in_tree, in_leaf_types)
    outs = jax.tree.unflatten(out_tree, list(body.out_avals))
    out_names = _result_names(outs)
    out_axes = _flat_axes(frag, frag.out_axes, _as_results(frag, outs), out_names, "out_axes", "result")
    out_agents = (_flat_axes(frag, agent_out, _as_results(frag, outs), out_names, "agent_axes", "result")
                  if frag.agent_axes is not None else [None] * len(out_axes))
    out_leaf_types = [LeafType.of(a, ax, g) for a, ax, g in zip(body.out_avals, out_axes, out_agents)]
    _check_agent_axes(frag, in_leaf_types + out_leaf_types)
    out_types = (_split_types(out_tree, out_leaf_types) if isinstance(outs, tuple)
                 else (TreeType(out_tree, tuple(out_leaf_types)),))
    passed = [i for i, arg in enumerate(args) if not isinstance(arg, Static)]  # a static argument is in the body
    fdef = FragmentDef(
        name=name or frag.name,
        role=frag.role,
        fn=flat_fn,
        arg_names=tuple(names[i] for i in passed),
        in_tree=jax.tree.structure(tuple(args[i] for i in passed)),
        out_tree=out_tree,
        in_axes=tuple(in_axes),
        out_axes=tuple(out_axes),
        in_types=tuple(_split_types(in_tree, in_leaf_types)[i] for i in passed),
        out_types=out_types,
        body=body,
        source=_source(frag.fn),
        host_steps=find_host_steps(body.jaxpr),
    )
    warn_shared_draws(fdef)
    return fdef


def check_per_replica(module: Module) -> list[str]:
    """What would break on several replicas: trace at 2 replicas' shapes every batch-parallel fragment that the
    module runs with one replica (unplaced, or placed so by `single`, `gspmd`, populations) and whose axes
    divide by 2 -> one line per fragment whose body or axis declaration works only with one replica (the
    caller says so; it runs as it is here). Fragments placed with R > 1 replicas are traced at R by lowering
    (`FragmentDef.body_for`, with the same message), which refuses them."""
    problems = []
    for fdef in module.callable_fragments().values():  # a host loop's parts are cut from one traced so
        n = fdef.batch_length()
        if (fdef.placement is None or fdef.placement.replicas == 1) and n is not None and n % 2 == 0:
            try:
                fdef.body_for(2)
            except FragcError as err:  # a fragment's rule, or the algorithm's own check of its replica's share
                problems.append(str(err))
    return problems


def _as_results(frag: Fragment, outs: Any) -> tuple:
    """Results as a tuple, the way `out_axes` addresses them."""
    if isinstance(outs, tuple) and isinstance(frag.out_axes, tuple):
        return outs
    return (outs,)


def _result_names(outs: Any) -> tuple[str, ...]:
    n = len(outs) if isinstance(outs, tuple) else 1
    return tuple(f"result {i}" for i in range(n))


def _flat_axes(frag: Fragment, axes: Any, values: tuple, names: tuple[str, ...], what: str, kind: str) -> list[int | None]:
    """Broadcast an axes declaration over values; one entry per leaf."""
    if not isinstance(axes, tuple):
        axes = (axes,) * len(values) if kind == "argument" else (axes,)
    if kind == "result" and len(values) == 1 and len(axes) != 1:
        values = values[0] if isinstance(values[0], tuple) else values
        names = tuple(f"result {i}" for i in range(len(values)))
    if len(axes) != len(values):
        raise FragmentError(
            f"fragment '{frag.name}': {what} has {len(axes)} entries but the fragment has "
            f"{len(values)} {kind}s ({', '.join(names)})"
        )
    flat: list[int | None] = []
    for axis, value, name in zip(axes, values, names):
        try:
            per_leaf = jax.tree.map(
                lambda a, sub: [a] * len(jax.tree.leaves(sub)), axis, value, is_leaf=lambda x: x is None
            )
        except (ValueError, TypeError) as err:
            raise FragmentError(
                f"fragment '{frag.name}', {kind} '{name}': {what} entry {axis!r} does not match the "
                f"{kind}'s pytree structure {jax.tree.structure(value)}"
            ) from err
        for a, leaf in zip(jax.tree.leaves(per_leaf, is_leaf=lambda x: x is None), jax.tree.leaves(value)):
            flat.append(_normalise_axis(frag, a, leaf, name, what, kind))
    return flat


def _normalise_axis(frag: Fragment, axis: Any, leaf: Any, name: str, what: str, kind: str) -> int | None:
    if axis is None:
        return None
    ndim = len(leaf.shape)
    if not isinstance(axis, int) or not 0 <= axis < ndim:
        raise FragmentError(
            f"fragment '{frag.name}', {kind} '{name}': {what} entry {axis!r} is not a valid axis "
            f"of a leaf of shape {tuple(leaf.shape)}"
        )
    return axis


def _check_axes(frag: Fragment, leaf_types: list[LeafType], args: tuple, names: tuple[str, ...]) -> None:
    """Every declared input axis must have the same length (the batch size)."""
    owners = [name for name, arg in zip(names, args) for _ in jax.tree.leaves(arg)]
    declared = [(t.shape[t.axis], owner) for t, owner in zip(leaf_types, owners) if t.axis is not None]
    for length, owner in declared[1:]:
        if length != declared[0][0]:
            raise FragmentError(
                f"fragment '{frag.name}': declared axes have different lengths: argument "
                f"'{declared[0][1]}' has {declared[0][0]}, argument '{owner}' has {length}"
            )


def _check_agent_axes(frag: Fragment, leaf_types: list[LeafType]) -> None:
    """Every declared agent axis has one length (the agent count), and is not a leaf's environment axis too."""
    lengths = sorted({t.shape[t.agent] for t in leaf_types if t.agent is not None})
    if len(lengths) > 1:
        raise FragmentError(f"fragment '{frag.name}': declared agent axes have different lengths {lengths}; an agent "
                            "axis holds one entry per agent")
    if any(t.agent is not None and t.agent == t.axis for t in leaf_types):
        raise FragmentError(f"fragment '{frag.name}': a leaf's agent axis is its environment axis too; declare them "
                            "on different dimensions")


def _trace_body(frag: Fragment, in_tree: Any, leaf_types: list[LeafType]) -> tuple[jex.ClosedJaxpr, Any, Callable]:
    out_tree_cell: list[Any] = []

    def flat_fn(*leaves: Any) -> list[Any]:
        out = frag.fn(*_unwrap_static(jax.tree.unflatten(in_tree, leaves)))
        out_leaves, out_tree = jax.tree.flatten(out)
        out_tree_cell[:] = [out_tree]
        return out_leaves

    structs = [t.struct() for t in leaf_types]
    try:
        body = jax.make_jaxpr(flat_fn, axis_env=[(REPLICA, 1)])(*structs)
    except TypeError as err:
        _explain_body_error(frag, in_tree, leaf_types, flat_fn.__name__, err)
        raise
    except ValueError as err:  # a jax.jit inside the fragment asks for a static argument that fragc traced
        names, types = frag.arg_names(len(in_tree.children())), _split_types(in_tree, leaf_types)
        traps.explain_static_argument(frag.name, _source(frag.fn), names, types, err)
        raise
    except NameError as err:  # a collective over an axis of the user's own naming (pmap-era code)
        traps.explain_unbound_axis(frag.name, _source(frag.fn), err)
        raise
    if any(isinstance(c, jax.core.Tracer) for c in body.consts):
        hint = (" (under a hyperparameter sweep: an object built once from the config, such as an optimizer in a "
                "cached_property, keeps the value it was built with; build it where it is used: docs/sweeps.md)"
                if isinstance(frag, SweptFragment) else "")
        raise FragmentError(f"fragment '{frag.name}' ({_source(frag.fn)}) closes over a value traced outside it; pass "
                            f"that value as an argument{hint}")
    return body, out_tree_cell[0], flat_fn


def _explain_body_error(frag: Fragment, in_tree: Any, leaf_types: list[LeafType], function: str,
                        err: TypeError) -> None:
    """Raise the frontend's one-line account of a body that JAX failed to trace, where it has one: a scan's
    carry changing dtype, an argument used as a Python value (a sweep's values are the sweep's to explain)."""
    names, types = frag.arg_names(len(in_tree.children())), _split_types(in_tree, leaf_types)
    traps.explain_carry_dtype(frag.name, names, types, err)
    leaf_names = [f"'{arg}{'.' + path if path else ''}' ({leaf})" for arg, t in zip(names, types)
                  for path, leaf in zip(t.paths, t.leaves)]
    swept = frozenset()
    if isinstance(frag, SweptFragment):  # its last argument, `hyperparameters`
        swept = frozenset(range(len(leaf_names) - len(types[-1].leaves), len(leaf_names)))
    traps.explain_python_value(
        function, f"fragment '{frag.name}' uses argument", leaf_names, err,
        "a fragment's arguments are traced arrays, Python numbers passed to it too (as under jax.jit); take a flag, "
        "size or count that picks code from the algorithm (self.config) or a closure, or pass it as a string or an "
        "enum member, which fragc binds into the body", swept, FragmentError)


def _split_types(tree: Any, leaf_types: list[LeafType]) -> tuple[TreeType, ...]:
    """Per-element types of a tuple treedef (the arguments, or a tuple of results)."""
    parts, offset = [], 0
    for child in tree.children():
        n = child.num_leaves
        parts.append(TreeType(child, tuple(leaf_types[offset : offset + n])))
        offset += n
    return tuple(parts)


def _function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The Python function behind a method, a static method, a `functools.partial` or a decorator's wrapper."""
    while True:
        inner = fn.func if isinstance(fn, functools.partial) else inspect.unwrap(getattr(fn, "__func__", fn))
        if inner is fn:
            return fn
        fn = inner


def _name(fn: Callable[..., Any], role: str) -> str:
    """A fragment's name in the IR: its function's (a partial's function's); a lambda's, its role's."""
    name = getattr(_function(fn), "__name__", "")
    return name if name.isidentifier() else (role if role.isidentifier() else "fragment")


def _source(fn: Callable[..., Any]) -> str:
    fn = _function(fn)
    try:
        file = inspect.getsourcefile(fn) or "?"
        line = inspect.getsourcelines(fn)[1]
    except (OSError, TypeError):
        return "?"
    return short_location(file, line)


# ---------------------------------------------------------------- trace


class _TraceContext:
    """Fragment definitions collected while tracing one iteration."""

    _count = itertools.count()

    def __init__(self) -> None:
        self.trace_id = next(self._count)
        self.defs: dict[Any, FragmentDef] = {}
        self.defs_by_name: dict[str, FragmentDef] = {}
        self.defining: list[str] = []  # the fragments whose bodies are being traced (to refuse nested calls)

    def define(self, frag: Fragment, args: tuple) -> FragmentDef:
        leaves, in_tree = jax.tree.flatten(args)
        # one function decorated twice (a Q-network's forward pass as the actor's and as the learner's target) is two
        # fragments: the declaration is part of the key; a weak type traces apart
        declaration = (type(frag), frag.role, repr(frag.in_axes), repr(frag.out_axes), repr(frag.agent_axes))
        key = (frag.fn, declaration, in_tree, tuple((t, t.weak_type) for t in map(LeafType.of, leaves)))
        if key not in self.defs:
            name, i = frag.name, 1
            while name in self.defs_by_name:
                name, i = f"{frag.name}_{i}", i + 1
            self.defining.append(frag.name)
            try:
                fdef = define(frag, args, name)
            finally:
                self.defining.pop()
            self.defs[key] = self.defs_by_name[name] = fdef
        return self.defs[key]


def _explain_python_value(algo: Any, function: str, state: Any, err: TypeError) -> None:
    """An iteration that branches in Python on a state value: name the leaf and the line (a sweep's values
    are the sweep's to explain: src/fragc/api.py `trace_for`)."""
    paths = [f"state{jax.tree_util.keystr(p)}" for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
    swept = frozenset()
    if isinstance(algo, sweep.SweptAlgorithm):
        swept = frozenset(range(len(paths) - len(algo.sweep.fields) - 1, len(paths) - 1))
    traps.explain_python_value(
        function, f"{type(algo).__name__}.iteration uses state leaf", paths, err,
        "the iteration is traced once for every step, so the state's values are known only when it runs; choose "
        "with lax.cond, lax.switch or jnp.where on it, or keep what picks code in the algorithm (self.config)", swept)


def _check_agent_count(algo: Any, defs: dict[str, FragmentDef]) -> None:
    """An algorithm that says how many agents its environment has (`num_agents`) declares agent axes of that
    length."""
    agents = getattr(algo, "num_agents", None)
    if not isinstance(agents, int):
        return
    for fdef in defs.values():
        n = fdef.agent_count()
        if n is not None and n != agents:
            raise FragcError(f"fragment '{fdef.name}' declares an agent axis of length {n}, but "
                             f"{type(algo).__name__}'s environment has {agents} agents (num_agents); agent_axes name "
                             "the axis that holds one entry per agent")


SEED = jax.ShapeDtypeStruct((), jnp.uint32)
"""The type of a seed (`Program.init(seed)`): `seeded_init`'s argument."""


def seeded_init(algo: Any) -> Callable[[jax.Array], Any]:
    """`seed -> algo.init(jax.random.key(seed))`. `trace` takes the state's type from it (`Module.init`) and
    `Program.init` jits the same function object, so JAX's trace cache (keyed by the function) traces `init`
    once for both."""
    return lambda seed: algo.init(jax.random.key(seed))


def trace(algo: Any, name: str | None = None) -> Module:
    """Trace `algo.iteration` into a module of fragments and glue."""
    for attr in ("init", "iteration"):
        if not callable(getattr(algo, attr, None)):
            raise FragcError(f"{type(algo).__name__} is not an algorithm: it has no method '{attr}(...)'")
    init = seeded_init(algo)
    state = jax.eval_shape(init, SEED)  # abstract: no key made on the device (two small compiles)
    state_leaves, state_tree = jax.tree.flatten(state)
    out_tree_cell: list[Any] = []

    def flat_iteration(*leaves: Any) -> list[Any]:
        result = algo.iteration(jax.tree.unflatten(state_tree, leaves))
        if not (isinstance(result, tuple) and len(result) == 2):
            raise FragcError(f"{type(algo).__name__}.iteration must return (state, metrics)")
        out, out_tree = jax.tree.flatten(result)
        out_tree_cell[:] = [out_tree]
        return out

    ctx = _TraceContext()
    token = _TRACING.set(ctx)
    try:
        with _JIT_CACHE_SCOPE(ctx.trace_id):
            closed = jax.make_jaxpr(flat_iteration)(*state_leaves)
    except TypeError as err:
        _explain_python_value(algo, flat_iteration.__name__, state, err)
        traps.explain_branch_outputs(algo, err)
        raise
    finally:
        _TRACING.reset(token)
    if isinstance(algo, sweep.SweptAlgorithm):  # SweepState's leaves: the algorithm's, hyper's (sorted), lineage
        fields = sorted(algo.sweep.fields)
        sweep.check_reads(closed.jaxpr, closed.jaxpr.invars[-len(fields) - 1:-1], fields, ctx.defs_by_name,
                          fragment_call_p, type(algo).__name__, sweep.init_reads(algo))
    _check_agent_count(algo, ctx.defs_by_name)
    traps.check_state_round_trip(algo, state_tree, out_tree_cell[0], state_leaves, closed)
    traps.check_metric_names(algo, out_tree_cell[0])
    traps.refuse_effects_outside_fragments(algo, closed.jaxpr, fragment_call_p)
    graph = build_graph(closed, fragment_call_p, TreeType.of(state), out_tree_cell[0], ctx.defs_by_name)
    return Module(name=name or type(algo).__name__.lower(), fragments=dict(ctx.defs_by_name), graph=graph, init=init)
