"""A vectorised population's fragments run their one-replica bodies with the replica reductions dropped
(`runtime.lower.population_fragment`), or the one-replica reference semantics where a body names the replica
axis otherwise; either way each member computes what its run by hand computes."""

import jax
import jax.numpy as jnp
import numpy as np

import fragc
from fragc.ir.collectives import without_unit_reductions
from fragc.runtime.lower import names_replica, population_fragment
from toy_algos import Regression, State, regression_by_hand


class _Gathering(Regression):
    """Regression whose learner averages its loss over an all-gather of the replicas' (its own, with one): a body
    that names the replica axis other than in a reduction."""

    @fragc.fragment(role="learner", in_axes=(None, 0, 0), out_axes=(None, None))
    def learn(self, w, x, y):
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        loss = jnp.mean(jax.lax.all_gather(loss, fragc.REPLICA))
        return w - self.lr * fragc.pmean(grad), {"loss": loss}


def _by_hand(algo, seed, member, iterations):
    @jax.jit
    def run(key):
        step = lambda state, _: regression_by_hand(state, 1, algo.lr)  # noqa: E731
        state, metrics = jax.lax.scan(step, algo.init(key), None, iterations)
        return state, metrics["loss"]

    state, losses = run(jax.random.key(seed + member))
    return state, np.asarray(losses)


def test_members_compute_their_runs_by_hand_with_and_without_the_replica_axis():
    for algo, named in ((Regression(num_envs=4), False), (_Gathering(num_envs=4), True)):
        module = fragc.trace(algo)
        learn = without_unit_reductions(module.fragments["learn"].body).jaxpr
        assert names_replica(module.fragments["learn"].body.jaxpr) and names_replica(learn) is named
        assert population_fragment(module.fragments["sample"]) is not None
        prog = fragc.compile(algo, fragc.population("single", 2), devices=1, iterations_per_dispatch=2)
        state, history = prog.run(prog.init(5), 3)
        for member in range(2):
            want, losses = _by_hand(algo, 5, member, 3)
            got = jax.tree.map(lambda x: x[member], state)
            np.testing.assert_allclose(np.asarray(got.w), np.asarray(want.w), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(history["loss"][member], losses, rtol=1e-5, atol=1e-6)
            assert isinstance(got, State) and int(got.step) == 3
