"""fragc's CPU lowerings (src/fragc/runtime/cpu_lowering.py): threefry straight (no 5-trip loop per random draw) and key-value
sorts packed into one 64-bit sort, each with the same bits as JAX's lowering, and a user's own programs outside fragc
keep JAX's choices."""

import json
import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fragc
from fragc.runtime import cpu_lowering
from fragc.runtime.cpu_lowering import cpu_lowerings
from toy_algos import Regression, regression_by_hand

ROLLED_THREEFRY = re.compile(r'known_trip_count":\{"n":"5"')  # JAX's CPU threefry: fori_loop(0, 5, ...)
PACKED_SORT = re.compile(r"= u64\[[0-9,]*\]\{[0-9,]*\} sort\(")  # one 64-bit buffer sorted
KEY_VALUE_SORT = re.compile(r"= \(u32\[[0-9,]*\]\{[0-9,]*\}, s32\[[0-9,]*\]\{[0-9,]*\}\) sort\(")  # JAX's: two buffers


@pytest.fixture(autouse=True)
def straight():
    """Both rules on (tests/conftest.py keeps JAX's threefry for the rest of the suite's compile time)."""
    with cpu_lowering.choosing(threefry=True, sort=True):
        yield


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
    with cpu_lowerings():
        straight = draw.lower(key).compile()
        with cpu_lowerings():  # nested blocks (a staged schedule's stages lowered in a fused one's)
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


class Shuffler:
    """A learner that shuffles as PPO's minibatches do (`jax.random.permutation`) and argsorts integer keys with
    ties (`jnp.argsort`, stable): each a key-value sort."""

    def init(self, key):
        return {"key": key, "order": jnp.arange(512), "ranks": jnp.zeros(300, jnp.int32)}

    @fragc.fragment(role="learner", in_axes=(None,), out_axes=(None, None))
    def shuffle(self, state):
        key, k_perm, k_ties = jax.random.split(state["key"], 3)
        ties = jax.random.randint(k_ties, (300,), -4, 4)  # signed, many equal
        ranks = jnp.argsort(ties, stable=True) + state["ranks"]
        return {"key": key, "order": state["order"][jax.random.permutation(k_perm, 512)], "ranks": ranks}, {}

    def iteration(self, state):
        return self.shuffle(state)


def test_fragc_programs_sort_keys_with_values_packed_and_in_the_stable_order_jax_sorts():
    algo = Shuffler()
    prog = fragc.compile(algo, "single", devices=1, iterations_per_dispatch=3)
    assert PACKED_SORT.search(prog.hlo("iteration", optimized=True))
    by_hand = jax.jit(lambda s: jax.lax.scan(lambda s, _: algo.iteration(s), s, None, 3)[0])
    assert KEY_VALUE_SORT.search(by_hand.lower(algo.init(jax.random.key(0))).compile().as_text())  # JAX's own

    state, _ = prog.run(prog.init(5), 3)
    want = by_hand(algo.init(jax.random.key(5)))
    np.testing.assert_array_equal(np.asarray(state["order"]), np.asarray(want["order"]))
    np.testing.assert_array_equal(np.asarray(state["ranks"]), np.asarray(want["ranks"]))
    assert sorted(np.asarray(state["order"]).tolist()) == list(range(512))  # a permutation


@pytest.mark.parametrize("dimension", [0, 1])
def test_packed_sorts_equal_jax_for_keys_with_ties_and_several_values(dimension):
    rng = np.random.default_rng(0)
    keys = {"u32": rng.integers(0, 6, (40, 33)).astype(np.uint32),
            "s32": rng.integers(-3, 3, (40, 33)).astype(np.int32),
            "s32_extremes": rng.choice(np.array([-2**31, -1, 0, 1, 2**31 - 1], np.int32), (40, 33))}
    values = (rng.normal(size=(40, 33)).astype(np.float32), rng.integers(-9, 9, (40, 33)).astype(np.int32))

    def sort(k, *v):
        return jax.lax.sort((k, *v), dimension=dimension, num_keys=1, is_stable=True)

    for name, k in keys.items():
        want = jax.jit(sort)(k, *values)
        with cpu_lowerings():
            # another function (JAX caches a function's lowering, whichever rules made it): lowered in the block
            packed = jax.jit(lambda k, *v: sort(k, *v)).lower(k, *values).compile()
        assert PACKED_SORT.search(packed.as_text()), name
        for got, expected in zip(packed(k, *values), want):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(expected), err_msg=name)


def test_sorts_it_cannot_pack_keep_jax_lowering():
    floats = jnp.linspace(1.0, -1.0, 17)
    with cpu_lowerings():
        float_keys = jax.jit(lambda k, v: jax.lax.sort_key_val(k, v)).lower(floats, jnp.arange(17)).compile()
        unstable = jax.jit(lambda k, v: jax.lax.sort((k, v), num_keys=1, is_stable=False)).lower(
            jnp.arange(17, dtype=jnp.uint32), jnp.arange(17)).compile()
        alone = jax.jit(jnp.sort).lower(jnp.arange(17, dtype=jnp.uint32)).compile()
    for program in (float_keys, unstable, alone):
        assert not PACKED_SORT.search(program.as_text())
    np.testing.assert_array_equal(np.asarray(float_keys(floats, jnp.arange(17))[1]), np.arange(17)[::-1])


def test_jax_caches_keep_the_block_apart_from_plain_jit_in_either_order():
    """A function lowered inside `cpu_lowerings()` does not hand its HLO to a later plain `jax.jit` of the same
    function (JAX caches lowerings by function), nor does a plain lowering hand its HLO to the block."""
    key = jax.random.key(0)

    def first_in_the_block(k):
        return jax.random.uniform(k, (4,))

    def first_outside(k):
        return jax.random.uniform(k, (5,))

    with cpu_lowerings():
        inside = jax.jit(first_in_the_block).lower(key).compile().as_text()
    outside = jax.jit(first_in_the_block).lower(key).compile().as_text()
    assert not ROLLED_THREEFRY.search(inside) and ROLLED_THREEFRY.search(outside)

    outside = jax.jit(first_outside).lower(key).compile().as_text()
    with cpu_lowerings():
        inside = jax.jit(first_outside).lower(key).compile().as_text()
    assert ROLLED_THREEFRY.search(outside) and not ROLLED_THREEFRY.search(inside)


def test_the_straight_rule_is_one_function_called_per_draw():
    """Registered `inline=False` (as JAX's own straight rule): the 20 rounds appear once per shape in the lowered
    module (here the split's and the six draws'), called where drawn, not written out at every draw."""
    def draws(key):
        return [jax.random.uniform(k, (4,)) for k in jax.random.split(key, 6)]

    with cpu_lowerings():
        text = jax.jit(draws).lower(jax.random.key(0)).as_text()
    assert len(re.findall(r"func\.func private @threefry2x32", text)) == 2
    assert len(re.findall(r"call @threefry2x32", text)) >= 2


def test_each_rule_is_measured_once_per_processor_and_kept(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cpu_lowering, "measure", lambda: {"threefry": {"on": False, "fragc_wall_s": 2.0},
                                                          "sort": {"on": True, "fragc_wall_s": 1.0}})
    assert cpu_lowering.measured_choices()["sort"]["on"] is True
    kept = json.loads((tmp_path / "fragc" / "cpu_lowerings.json").read_text())
    assert kept[f"{cpu_lowering.processor()} | {cpu_lowering.WORKLOADS_VERSION}"]["threefry"]["on"] is False

    def measure_again():
        raise AssertionError("measured again")

    monkeypatch.setattr(cpu_lowering, "measure", measure_again)
    assert cpu_lowering.measured_choices()["threefry"]["on"] is False  # read back, not measured


def test_measure_times_both_lowerings_of_each_rule():
    """Each rule's workload is built once with the rule and once with JAX's lowering, and timed."""
    built = []

    def workload(rule):
        def build():
            built.append((rule, cpu_lowering.chosen(rule)))
            return lambda: None
        return build

    out = cpu_lowering.measure(rounds=2, workloads={r: workload(r) for r in cpu_lowering.RULES})
    assert built == [(r, on) for r in cpu_lowering.RULES for on in (True, False)]
    assert set(out) == set(cpu_lowering.RULES)
    for rule, m in out.items():
        assert all(m[f"{side}_{what}_s"] >= 0 for side in ("fragc", "jax") for what in ("wall", "cpu")), rule
        assert m["on"] == (m["fragc_wall_s"] < cpu_lowering.MARGIN * m["jax_wall_s"]
                           and m["fragc_cpu_s"] <= m["jax_cpu_s"])


def test_the_micro_workloads_compile_with_and_without_their_rule():
    import fragc.api  # noqa: F401  (registers the training-iteration workload of threefry)

    assert cpu_lowering.WORKLOADS["threefry"].__module__ == "fragc.lowering_workloads"
    for on in (True, False):
        with cpu_lowering.choosing(threefry=False, sort=on):
            cpu_lowering.WORKLOADS["sort"]()()


@pytest.mark.parametrize("variable", ["FRAGC_THREEFRY", "FRAGC_SORT"])
def test_an_unknown_choice_is_refused_in_one_line(monkeypatch, variable):
    monkeypatch.setenv(variable, "fastest")
    rule = "threefry" if variable == "FRAGC_THREEFRY" else "sort"
    with pytest.raises(fragc.FragcError, match=f"^{variable}='fastest': expected auto, "):
        cpu_lowering.forced(rule)
