"""fragc lowers threefry straight on the CPU (runtime/prng_lowering.py): no 5-trip loop per random draw in its
programs, the same bits as JAX's rolled lowering, and a user's own programs outside fragc keep JAX's choice."""

import re
import threading

import jax
import numpy as np
import pytest

import fragc
from fragc.runtime import prng_lowering
from fragc.runtime.prng_lowering import straight_threefry
from toy_algos import Regression, regression_by_hand

ROLLED_THREEFRY = re.compile(r'known_trip_count":\{"n":"5"')  # JAX's CPU threefry: fori_loop(0, 5, ...)


@pytest.fixture(autouse=True)
def straight(monkeypatch):
    """The lowering users get (tests/conftest.py keeps JAX's for the rest of the suite's compile time)."""
    monkeypatch.setattr(prng_lowering, "enabled", True)


def _by_hand(algo, seed, iterations):
    @jax.jit
    def run(key):
        return jax.lax.scan(lambda s, _: regression_by_hand(s, 1, algo.lr), algo.init(key), None, iterations)[0]

    return run, jax.random.key(seed)


def test_fragc_programs_draw_threefry_without_loops_and_the_same_bits_as_jax():
    algo = Regression(num_envs=4)
    prog = fragc.compile(algo, "single", devices=1, iterations_per_dispatch=3)
    assert not ROLLED_THREEFRY.search(prog.hlo("iteration", optimized=True))
    run, key = _by_hand(algo, 7, 3)
    assert ROLLED_THREEFRY.search(run.lower(key).compile().as_text())  # JAX's own CPU lowering, outside fragc

    state, _ = prog.run(prog.init(7), 3)
    want = run(key)
    np.testing.assert_array_equal(np.asarray(state.data.x), np.asarray(want.data.x))  # every draw, bit for bit
    np.testing.assert_array_equal(jax.random.key_data(state.data.key), jax.random.key_data(want.data.key))
    np.testing.assert_allclose(np.asarray(state.w), np.asarray(want.w), rtol=1e-6)


def test_the_choice_is_scoped_to_the_block_and_its_thread():
    draw = jax.jit(lambda key: jax.random.normal(key, (16,)))
    key = jax.random.key(0)
    with straight_threefry():
        straight = draw.lower(key).compile()
        with straight_threefry():  # nested blocks (a staged schedule's stages lowered in a fused one's)
            pass
        assert not ROLLED_THREEFRY.search(jax.jit(lambda k: jax.random.uniform(k, (8,))).lower(key).compile().as_text())
        elsewhere = []  # another thread lowering meanwhile (a user's program) keeps JAX's lowering
        thread = threading.Thread(target=lambda: elsewhere.append(
            jax.jit(lambda k: jax.random.uniform(k, (4,))).lower(key).compile().as_text()))
        thread.start()
        thread.join()
        assert ROLLED_THREEFRY.search(elsewhere[0])
    assert not ROLLED_THREEFRY.search(straight.as_text())
    assert ROLLED_THREEFRY.search(jax.jit(lambda k: jax.random.uniform(k, (8,))).lower(key).compile().as_text())
    rolled = jax.jit(lambda k: jax.random.normal(k, (16,)))
    np.testing.assert_array_equal(np.asarray(straight(key)), np.asarray(rolled(key)))
