"""Hyperparameters as values of a population: config fields that differ per member of one program.

PureJaxRL sweeps a learning rate by making it a traced argument of `train`
and vmapping over it. fragc does the same without changing the algorithm:
while the iteration is traced, the algorithm's `config` is a copy whose
swept fields are traced values, so every place the algorithm reads
`self.config.lr` (in a fragment or in the glue between fragments) reads the
member's own value. The values live in the training state
(`SweepState.hyper`, one scalar per field and member), so they are
checkpointed with it and population-based training can change them.

A fragment reads only its arguments, so each fragment call under a sweep
gets the values as one more argument, `hyperparameters` (replicated), and
its body is traced with the config that argument makes (`Sweep.fragment`).

The pattern an algorithm follows (docs/sweeps.md): read hyperparameters from
`self.config` where they are used, at trace time; do not copy them into
objects built once (an optax optimizer in a `cached_property` keeps the
learning rate it was built with). `check_reads` catches a swept field that
the traced program never reads, and a field that sets a shape or a Python
branch fails to trace with a traced value and is refused, naming it.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import difflib
import threading
from typing import Any, Callable, Iterator, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .errors import FragcError
from .population import PBT, Grid, grid_members  # noqa: F401  (offered here too: the sweep's names)

_ACTIVE: contextvars.ContextVar["tuple[Sweep, dict] | None"] = contextvars.ContextVar("fragc_sweep", default=None)
_LOCK = threading.RLock()
"""Held while `algo.config` is swapped for a traced copy, so that two threads tracing one algorithm never see each
other's values (`fragc.compile` itself traces a sweep in one thread: see src/fragc/api.py)."""



@struct.dataclass
class SweepState:
    """The training state of a population that varies hyperparameters: the algorithm's own state, per
    swept config field its value (a scalar per member), and `lineage`: the member whose training this
    state continues (itself, until population-based training copies another's: src/fragc/runtime/pbt.py)."""

    state: Any
    hyper: dict[str, jax.Array]
    lineage: jax.Array


def active() -> "tuple[Sweep, dict] | None":
    """The sweep whose config is swapped in now, with the values it reads (None outside a sweep)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """No sweep active: for the call of a fragment that takes the swept values as its last argument."""
    token = _ACTIVE.set(None)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


class Sweep:
    """The config fields of `algo` that a population varies, and the tracing that substitutes them."""

    def __init__(self, algo: Any, fields: Sequence[str]):
        self.algo, self.fields = algo, tuple(fields)
        self.base = algo.config
        self._fragments: dict[Any, Any] = {}

    def dtype(self, field: str) -> Any:
        return jnp.int32 if isinstance(getattr(self.base, field), int) else jnp.float32

    def defaults(self) -> dict[str, jax.Array]:
        """The base config's values, as the state holds them."""
        return {f: jnp.asarray(getattr(self.base, f), self.dtype(f)) for f in self.fields}

    @contextlib.contextmanager
    def values(self, hyper: Mapping[str, Any]) -> Iterator[None]:
        """`algo.config` with the swept fields set to `hyper`'s values (traced ones, while tracing)."""
        with _LOCK:
            config = copy.copy(self.base)
            for f in self.fields:
                object.__setattr__(config, f, hyper[f])  # no __post_init__: its range checks need numbers
            saved = self.algo.config
            self.algo.config = config
            token = _ACTIVE.set((self, dict(hyper)))
            try:
                yield
            finally:
                _ACTIVE.reset(token)
                self.algo.config = saved

    def fragment(self, frag: Any, nargs: int, make: Callable[[Any, "Sweep", int], Any]) -> Any:
        """`frag` taking the swept values as one more (replicated) argument, with which its body is traced:
        `make(frag, self, nargs)` (the frontend's `SweptFragment`), made once per function and argument count."""
        key = (frag.fn, nargs)
        if key not in self._fragments:
            self._fragments[key] = make(frag, self, nargs)
        return self._fragments[key]


class SweptAlgorithm:
    """`algo` with `SweepState` as its state: what fragc traces and runs for a population with a grid."""

    def __init__(self, sweep: Sweep):
        self.sweep, self.algo = sweep, sweep.algo

    @property
    def config(self) -> Any:
        return self.algo.config

    def init(self, key: jax.Array, hyper: Mapping[str, Any] | None = None, member: Any = 0) -> SweepState:
        hyper = self.sweep.defaults() if hyper is None else dict(hyper)
        with self.sweep.values(hyper):
            return SweepState(self.algo.init(key), hyper, jnp.asarray(member, jnp.int32))

    def iteration(self, state: SweepState) -> tuple[SweepState, Any]:
        with self.sweep.values(state.hyper):
            inner, metrics = self.algo.iteration(state.state)
        return state.replace(state=inner), metrics


def swept(algo: Any, fields: Sequence[str]) -> SweptAlgorithm:
    """`algo` wrapped for a sweep over `fields`, under a class named like the algorithm's (error messages
    name the user's algorithm)."""
    cls = type(type(algo).__name__, (SweptAlgorithm,), {"__module__": __name__})
    return cls(Sweep(algo, fields))


# ---------------------------------------------------------------- the grid


def check_grid(algo: Any, grid: Grid) -> None:
    """Every swept field is a number field of `algo.config` (a dataclass), and every value makes a valid
    config (its own range checks, one line naming the value)."""
    config = getattr(algo, "config", None)
    name = type(algo).__name__
    if config is None or not dataclasses.is_dataclass(config):
        raise FragcError(f"a hyperparameter sweep varies fields of the algorithm's config dataclass "
                         f"(`self.config`); {name} has none")
    fields = {f.name for f in dataclasses.fields(config)}
    for field, values in grid:
        if field not in fields:
            close = difflib.get_close_matches(field, fields, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise FragcError(f"sweep: {name}'s config has no field '{field}'{hint}")
        base = getattr(config, field)
        if isinstance(base, bool) or not isinstance(base, (int, float)):
            raise FragcError(f"sweep: {name}'s '{field}' is {type(base).__name__}, not a number: a population "
                             f"varies numbers only (a {type(base).__name__} picks code, not a value)")
        if not values:
            raise FragcError(f"sweep: '{field}' has no values")
        for v in values:
            if isinstance(base, int) and not (isinstance(v, (int, np.integer)) or float(v).is_integer()):
                raise FragcError(f"sweep: {name}'s '{field}' is a whole number, got {v!r}")
            try:
                dataclasses.replace(config, **{field: type(base)(v)})
            except FragcError as err:
                raise FragcError(f"sweep: {field}={v}: {err}") from None


def check_reads(jaxpr: Any, hyper_vars: Sequence[Any], fields: Sequence[str], bodies: Mapping[str, Any],
                fragment_call: Any, algo_name: str, init: tuple[Any, Sequence[Any]] | None = None) -> None:
    """Refuse a swept field that neither the traced iteration nor `init` (`init`: its jaxpr and hyper variables)
    reads (an initial value, such as SAC's
    temperature, is read by `init` alone): the algorithm copied it somewhere at construction (an optimizer built
    once, a value stored in `__init__`), so sweeping it would change nothing."""
    for var, field in zip(hyper_vars, fields):
        if not _reads(jaxpr, var, bodies, fragment_call) and not (init and _reads(init[0], init[1][fields.index(field)],
                                                                                    bodies, fragment_call)):
            raise FragcError(
                f"sweep: {algo_name} never reads config.{field} while tracing init and its iteration: it is unused in "
                f"this configuration, or it was copied when the algorithm was built (an optimizer or a value made in "
                f"__init__ or a cached_property), so every member would use the same {field}; read "
                f"self.config.{field} where it is used (docs/sweeps.md)")


def init_reads(algo: "SweptAlgorithm") -> tuple[Any, list[Any]]:
    """`algo.init(key, hyper)` traced, and its variables of hyper's values (sorted by field), for `check_reads`."""
    jaxpr = jax.make_jaxpr(lambda key, hyper: algo.init(key, hyper))(jax.random.key(0), algo.sweep.defaults()).jaxpr
    return jaxpr, jaxpr.invars[1:]


def _reads(jaxpr: Any, var: Any, bodies: Mapping[str, Any], fragment_call: Any) -> bool:
    """Whether an equation of `jaxpr` computes with `var`: looking into fragment bodies and the regions of
    `scan`, `cond`, `while` and nested jits (where a value only passes through, it is not read)."""
    for eqn in jaxpr.eqns:
        for pos, v in enumerate(eqn.invars):
            if v is not var:
                continue
            inner = _inner_vars(eqn, pos, bodies, fragment_call)
            if inner is None or any(_reads(j, x, bodies, fragment_call) for j, x in inner):
                return True
    return False


def _inner_vars(eqn: Any, pos: int, bodies: Mapping[str, Any], fragment_call: Any) -> list | None:
    """The (jaxpr, variable) pairs that operand `pos` of `eqn` becomes inside its regions; None for an
    equation that computes with it directly."""
    name, params = eqn.primitive.name, eqn.params
    if eqn.primitive is fragment_call:
        body = bodies[params["fragment"]].body.jaxpr
        return [(body, body.invars[pos])]
    if name in ("scan", "pjit", "jit", "closed_call", "remat", "checkpoint", "custom_jvp_call", "custom_vjp_call"):
        sub = params.get("jaxpr") or params.get("call_jaxpr") or params.get("fun_jaxpr")
        sub = getattr(sub, "jaxpr", sub)
        return [(sub, sub.invars[pos])] if sub is not None and pos < len(sub.invars) else None
    if name == "cond":
        return None if pos == 0 else [(b.jaxpr, b.jaxpr.invars[pos - 1]) for b in params["branches"]]
    if name == "while":
        nc, nb = params["cond_nconsts"], params["body_nconsts"]
        cond, body = params["cond_jaxpr"].jaxpr, params["body_jaxpr"].jaxpr
        if pos < nc:
            return [(cond, cond.invars[pos])]
        if pos < nc + nb:
            return [(body, body.invars[pos - nc])]
        return [(cond, cond.invars[nc + pos - nc - nb]), (body, body.invars[pos - nc])]
    return None


def explain_shape_field(err: Exception, fields: Sequence[str], algo_name: str) -> FragcError:
    """A trace that failed on a traced swept value: the field sets a shape or a Python branch."""
    names = ", ".join(f"'{f}'" for f in fields)
    return FragcError(
        f"sweep: {algo_name} uses {'one of ' if len(fields) > 1 else ''}{names} as a Python value (a shape, a "
        f"loop count or an `if`), so members cannot share one program; sweep only fields used as numbers, and "
        f"run separate sweeps for the others ({type(err).__name__}: {str(err).splitlines()[0][:160]})")
