"""Finding random numbers that every replica of a fragment would draw alike.

With R replicas, a fragment's replicated (`in_axes=None`) inputs are the same
on every replica, so a key derived only from them gives every replica the same
stream. Drawing per-environment randomness from such a key (splitting it into
one key per environment, or sampling an array with an environment axis) makes
the environments of different replicas share their noise; PureJaxRL's rollout
does this in a `lax.scan` over time (`jax.random.split(rng, NUM_ENVS)`,
`pi.sample(seed=rng)`).

`shared_draws` follows which values vary between replicas (those computed
from a batched input or from `lax.axis_index`) through the body, into scans,
loops, conds and calls, and reports each `random_split`/`random_bits` whose
key does not vary but whose result has the environment count in its shape.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

from jax.extend import core as jex
from jax.extend import source_info_util

from .errors import FragmentError
from .jax_compat import scan_counts
from .module import FragmentDef


def warn_shared_draws(fdef: FragmentDef) -> None:
    """Warn when per-environment randomness comes from a replicated key.

    With R replicas every replica would split (or sample from) the same key and
    draw the same streams; per-environment keys belong in the batched state.
    Found through `lax.scan` bodies and other nested jaxprs (`shared_draws`), and
    confirmed in the body traced at 2 replicas, where a per-environment draw halves.
    """
    n = fdef.batch_length()
    if n is None or n == 1:  # one environment: one replica at most, and every length-1 dimension would match
        return
    varying = [t.axis is not None for t in fdef.in_leaf_types]
    draws = shared_draws(fdef.body.jaxpr, varying, n)
    if draws and n % 2 == 0:  # confirmed at 2 replicas: a dimension that is n only by chance stays n
        try:
            body = fdef.body_for(2)
        except FragmentError:  # fragc.compile reports it; warn about what one replica shows
            body = None
        if body is not None:
            halved = {(d.where, d.eqn.primitive) for d in shared_draws(body.jaxpr, varying, n // 2)}
            draws = [d for d in draws if (d.where, d.eqn.primitive) in halved]
    if not draws:
        return
    draw = draws[0]
    what = (f"splits a replicated key into {n} keys, one per environment" if draw.is_split else
            f"samples random numbers of shape {list(draw.shape)} (one per environment) from a replicated key")
    warnings.warn(
        f"fragment '{fdef.name}' {what} (at {draw.where}): with several replicas every replica would draw "
        "the same random streams. Carry per-environment keys in the batched state (split them per "
        "environment with jax.vmap(jax.random.split)) instead; see docs/porting.md.",
        stacklevel=4,
    )


class SharedDraw(NamedTuple):
    """One random draw from a replicated key, sized per environment."""

    eqn: jex.JaxprEqn
    shape: tuple[int, ...]
    where: str  # file:line of the user's code that makes the draw

    @property
    def is_split(self) -> bool:
        return self.eqn.primitive.name == "random_split"


def shared_draws(jaxpr: jex.Jaxpr, varying_inputs: list[bool], n: int) -> list[SharedDraw]:
    """The draws of `jaxpr` (inputs varying between replicas as given) that every replica makes alike."""
    found: list[SharedDraw] = []
    _walk(jaxpr, varying_inputs, n, found, "?")
    return found


def _walk(jaxpr: jex.Jaxpr, varying_inputs: list[bool], n: int, found: list[SharedDraw], where: str) -> list[bool]:
    """Record shared draws; return which outputs vary between replicas.

    `where` is the user's line that the equations of `jaxpr` come from, for those (inside
    `jax.random`'s own jitted functions) whose source is all library code."""
    varying = {v for v, flag in zip(jaxpr.invars, varying_inputs) if flag}

    def is_varying(v) -> bool:
        return isinstance(v, jex.Var) and v in varying

    for eqn in jaxpr.eqns:
        ins = [is_varying(v) for v in eqn.invars]
        here = source_info_util.summarize(eqn.source_info) or where
        rule = _HIGHER_ORDER.get(eqn.primitive.name)
        if rule is not None:
            outs = rule(eqn, ins, n, found, here)
        else:
            _check_draw(eqn, ins, n, found, here)
            outs = [any(ins) or eqn.primitive.name == "axis_index"] * len(eqn.outvars)
        varying.update(v for v, flag in zip(eqn.outvars, outs) if flag)
    return [is_varying(v) for v in jaxpr.outvars]


def _check_draw(eqn: jex.JaxprEqn, ins: list[bool], n: int, found: list[SharedDraw], where: str) -> None:
    if eqn.primitive.name not in ("random_split", "random_bits") or ins[0]:
        return
    shape = tuple(eqn.outvars[0].aval.shape)
    per_env = shape[:1] == (n,) if eqn.primitive.name == "random_split" else n in shape
    if per_env:
        found.append(SharedDraw(eqn, shape, where))


def _inner(jaxpr) -> jex.Jaxpr:
    return jaxpr.jaxpr if isinstance(jaxpr, jex.ClosedJaxpr) else jaxpr


def _loop(body: jex.Jaxpr, consts: list[bool], carry: list[bool], rest: list[bool], n: int,
          found: list[SharedDraw], where: str) -> list[bool]:
    """A loop body (consts, carry, rest) -> (carry, ...): iterate until the carry's variation is stable."""
    while True:
        scratch: list[SharedDraw] = []
        outs = _walk(body, consts + carry + rest, n, scratch, where)
        new_carry = [a or b for a, b in zip(carry, outs[: len(carry)])]
        if new_carry == carry:
            found.extend(scratch)
            return outs
        carry = new_carry


def _scan(eqn: jex.JaxprEqn, ins: list[bool], n: int, found: list[SharedDraw], where: str) -> list[bool]:
    c, k = scan_counts(eqn)
    return _loop(_inner(eqn.params["jaxpr"]), ins[:c], ins[c : c + k], ins[c + k :], n, found, where)


def _while(eqn: jex.JaxprEqn, ins: list[bool], n: int, found: list[SharedDraw], where: str) -> list[bool]:
    cc, bc = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
    return _loop(_inner(eqn.params["body_jaxpr"]), ins[cc : cc + bc], ins[cc + bc :], [], n, found, where)


def _cond(eqn: jex.JaxprEqn, ins: list[bool], n: int, found: list[SharedDraw], where: str) -> list[bool]:
    outs = [ins[0]] * len(eqn.outvars)  # a varying predicate makes every result vary
    for branch in eqn.params["branches"]:
        outs = [a or b for a, b in zip(outs, _walk(_inner(branch), ins[1:], n, found, where))]
    return outs


def _call(eqn: jex.JaxprEqn, ins: list[bool], n: int, found: list[SharedDraw], where: str) -> list[bool]:
    """A primitive whose one sub-jaxpr takes its operands and gives its results (jit, custom_jvp, remat)."""
    subs = [_inner(j) for j in jex.jaxprs_in_params(eqn.params)]
    if len(subs) >= 1 and len(subs[0].invars) == len(ins) and len(subs[0].outvars) == len(eqn.outvars):
        return _walk(subs[0], ins, n, found, where)
    return [any(ins)] * len(eqn.outvars)


_HIGHER_ORDER = {
    "scan": _scan,  # consts, carry, xs -> carry, ys
    "while": _while,  # cond consts, body consts, carry -> carry
    "cond": _cond,  # index, operands -> results of the branch taken
    "pjit": _call,
    "jit": _call,
    "closed_call": _call,
    "core_call": _call,
    "remat": _call,
    "checkpoint": _call,
    "custom_jvp_call": _call,
    "custom_vjp_call": _call,
    "custom_vjp_call_jaxpr": _call,
}
"""How variation between replicas flows through each higher-order primitive."""
