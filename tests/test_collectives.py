"""fragc.pmean/psum: exact replica-order sums on any device count, and the bytes `cost()` says they move."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from jax.sharding import Mesh, PartitionSpec as P

import fragc
from conftest import assert_trees_close, traced_module
from fragc.ir.module import REPLICA

PAYLOAD = 1001  # f32 elements per reduction: no device count here divides it, so the chunks are padded
STEPS = 3  # reductions per iteration (a scan around the pmean)


def ordered_sum(rows: np.ndarray) -> np.ndarray:
    """Replica 0 + replica 1 + ... in float32, left to right: the order fragc promises."""
    total = rows[0].copy()
    for r in rows[1:]:
        total = (total + r).astype(np.float32)
    return total


def on_devices(fn, x: jax.Array, replicas: int):
    """`fn` of each replica's row, one replica per device (the lowering's shard_map)."""
    mesh = Mesh(np.array(jax.devices()[:replicas]), (REPLICA,))
    return jax.shard_map(lambda v: fn(v[0]), mesh=mesh, in_specs=P(REPLICA), out_specs=P(), check_vma=False)(x)


@pytest.mark.parametrize("replicas", [2, 8])
def test_deterministic_sum_is_the_replica_order_sum_bit_for_bit(replicas):
    x = jax.random.normal(jax.random.key(replicas), (replicas, 37)) * 1e3

    def reduce(v):  # two dtypes and a scalar: one payload per dtype
        return fragc.psum({"a": v, "b": v[:5].astype(jnp.int32), "c": v[0]}), fragc.pmean(v)

    def both(x):
        return on_devices(reduce, x, replicas), jax.vmap(reduce, axis_name=REPLICA)(x)  # vmap: the interpreter's form

    (total, mean), (vm_total, _) = jax.jit(both)(x)
    expected = ordered_sum(np.asarray(x))
    np.testing.assert_array_equal(np.asarray(total["a"]), expected)
    np.testing.assert_array_equal(np.asarray(vm_total["a"][0]), expected)
    np.testing.assert_array_equal(np.asarray(total["b"]), np.asarray(x[:, :5]).astype(np.int32).sum(0))
    np.testing.assert_array_equal(np.asarray(total["c"]), expected[0])
    np.testing.assert_array_equal(np.asarray(mean), expected / np.float32(replicas))


def test_native_all_reduce_is_the_sum_up_to_rounding():
    x = jax.random.normal(jax.random.key(0), (8, 37))
    native = jax.jit(lambda x: on_devices(lambda v: fragc.pmean(v, deterministic=False), x, 8))(x)
    np.testing.assert_allclose(np.asarray(native), np.asarray(x).mean(0), rtol=1e-5, atol=1e-6)


@struct.dataclass
class State:
    w: jax.Array  # [PAYLOAD], replicated
    x: jax.Array  # [8, PAYLOAD], batched over replicas


class Averaging:
    """A learner that averages a PAYLOAD-float gradient over replicas STEPS times per iteration."""

    def __init__(self, deterministic: bool):
        self.deterministic = deterministic

    def init(self, key):
        return State(jnp.zeros(PAYLOAD), jax.random.normal(key, (8, PAYLOAD)))

    @fragc.fragment(role="learner", in_axes=(None, 0), out_axes=None)
    def learn(self, w, x):
        def step(w, _):
            return w - 0.1 * fragc.pmean(jnp.mean(x, 0) + w, deterministic=self.deterministic), None

        return jax.lax.scan(step, w, None, STEPS)[0]

    def iteration(self, state):
        return State(self.learn(state.w, state.x), state.x), {}


@pytest.mark.parametrize("deterministic", [True, False])
def test_cost_counts_the_bytes_each_device_receives(deterministic):
    algo = Averaging(deterministic)
    for replicas in (2, 4, 8):
        got = fragc.compile(algo, "anakin", devices=replicas).cost()["total"]["collective_bytes"]
        ring = STEPS * 2 * (replicas - 1) / replicas * PAYLOAD * 4  # the analytic figure: twice the payload, less 1/R
        assert abs(got - ring) <= 0.1 * ring, (replicas, got, ring)
        if deterministic:  # exactly: an all-to-all and an all-gather of R-1 padded chunks each
            assert got == STEPS * 2 * (replicas - 1) * -(-PAYLOAD // replicas) * 4
    if deterministic:  # the compiled program and the reference interpreter agree to the bit
        prog = fragc.compile(algo, "anakin", devices=8)
        state, _ = prog.run(prog.init(0), 1)
        ref, _ = fragc.interpret(traced_module(prog), prog.init(0), replicas={"learner": 8})
        np.testing.assert_array_equal(np.asarray(state.w), np.asarray(ref.w))


def test_one_replica_on_one_device_compiles_without_all_reduces():
    """`lower_fragment` drops a one-replica body's reductions (src/fragc/ir/collectives.py `without_unit_reductions`):
    XLA would keep each as an all-reduce over one device (a collective kernel a gradient step on a GPU). The
    single program has none left, and still equals the reference interpreter."""
    from toy_algos import Regression

    algo = Regression()
    module = fragc.trace(algo)
    assert any(e.primitive.name == "psum" for f in module.callable_fragments().values() for e in f.body.jaxpr.eqns)
    prog = fragc.compile(algo, "single", iterations_per_dispatch=2)
    assert "all-reduce" not in prog.hlo("iteration", optimized=True)
    state = prog.init(0)
    got, history = prog.run(state, 2)
    ref = state
    for i in range(2):
        ref, metrics = fragc.interpret(module, ref)
        np.testing.assert_allclose(history["loss"][i], metrics["loss"], rtol=1e-6)
    assert_trees_close(got, ref, rtol=1e-6, atol=1e-7)
