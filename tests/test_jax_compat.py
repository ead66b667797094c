"""src/fragc/ir/jax_compat.py reads a scan equation's operand groups whichever JAX release made it (0.10's num_consts /
num_carry, 0.11's ft_in): checked on the installed JAX against the scan's own operands."""

import jax
import jax.numpy as jnp

from fragc.ir.jax_compat import scan_counts


def _scan_eqn(fn, *args):
    eqns = [e for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns if e.primitive.name == "scan"]
    assert len(eqns) == 1
    return eqns[0]


def test_scan_counts_split_consts_carry_and_xs():
    w = jnp.arange(3.0)

    def fn(carry, xs):
        def step(c, x):
            (a, b) = c
            return (a + x * w, b * 2.0), a * x
        return jax.lax.scan(step, carry, xs)

    eqn = _scan_eqn(fn, (jnp.zeros(3), jnp.float32(1.0)), jnp.ones((4, 3)))
    nc, nk = scan_counts(eqn)
    assert (nc, nk, len(eqn.invars) - nc - nk) == (1, 2, 1)  # w; (a, b); xs
    body = eqn.params["jaxpr"].jaxpr
    assert [v.aval.shape for v in body.invars[nc:nc + nk]] == [(3,), ()]  # the carried leaves, in order
    assert body.invars[nc + nk].aval.shape == (3,)  # one slice of xs


def test_scan_counts_without_consts_or_xs():
    eqn = _scan_eqn(lambda c: jax.lax.scan(lambda c, _: (c + 1.0, None), c, None, length=5), jnp.float32(0.0))
    assert scan_counts(eqn) == (0, 1)
    assert len(eqn.invars) == 1
