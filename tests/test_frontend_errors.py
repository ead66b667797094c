"""Clear errors (and one warning) for mistakes in declaring or calling fragments."""

import re

import jax
import jax.numpy as jnp
import pytest

import fragc
from toy_algos import Regression


def test_axes_not_matching_the_argument_structure():
    @fragc.fragment(role="actor", in_axes=({"a": 0, "b": 0},), out_axes=0)
    def f(x):
        return x["a"]

    with pytest.raises(fragc.FragmentError, match=r"fragment 'f', argument 'x': in_axes entry .* structure"):
        f({"a": jnp.ones(4), "c": jnp.ones(4)})


def test_wrong_number_of_axes_entries():
    @fragc.fragment(role="actor", in_axes=(0, 0), out_axes=0)
    def g(x):
        return x

    with pytest.raises(fragc.FragmentError, match=r"fragment 'g': in_axes has 2 entries but the fragment has 1 argument"):
        g(jnp.ones(4))


def test_declared_axes_of_different_lengths():
    @fragc.fragment(role="actor", in_axes=(0, 0), out_axes=0)
    def h(obs, keys):
        return obs

    with pytest.raises(fragc.FragmentError, match=r"fragment 'h': declared axes have different lengths: argument 'obs' has 4, argument 'keys' has 6"):
        h(jnp.ones((4, 2)), jnp.ones(6))


def test_axis_out_of_range():
    @fragc.fragment(role="actor", in_axes=(2,), out_axes=0)
    def k(x):
        return x

    with pytest.raises(fragc.FragmentError, match=r"fragment 'k', argument 'x': in_axes entry 2 is not a valid axis"):
        k(jnp.ones((4, 2)))


def test_replica_count_that_does_not_divide_an_axis():
    algo = Regression(num_envs=6)
    module = fragc.trace(algo)
    with pytest.raises(fragc.FragmentError, match=r"fragment 'sample', argument 'data.x': axis 0 has length 6, which 4 replicas do not divide"):
        fragc.interpret(module, algo.init(jax.random.key(0)), replicas=4)


def test_replicated_output_that_differs_between_replicas():
    @fragc.fragment(role="learner", in_axes=(0,), out_axes=None)
    def mean_without_pmean(x):
        return jnp.mean(x)

    with pytest.raises(fragc.FragmentError, match=r"fragment 'mean_without_pmean': an output declared replicated"):
        mean_without_pmean(jnp.arange(4.0))


def test_keyword_arguments_bind_as_python_binds_them():
    @fragc.fragment(role="actor", in_axes=(0, None), out_axes=0)
    def kw(x, scale=2.0):
        return x * scale

    assert float(kw(x=jnp.ones(3))[0]) == 2.0  # the default, as a constant argument
    assert float(kw(jnp.ones(3), scale=3.0)[0]) == 3.0
    with pytest.raises(fragc.FragmentError, match=r"fragment 'kw' called at .*test_frontend_errors.py:\d+ with "
                                                  r"keywords \(y\): got an unexpected keyword argument 'y'"):
        kw(jnp.ones(3), y=1.0)


def test_keyword_only_and_var_keyword_arguments_are_refused_by_their_kind():
    @fragc.fragment(role="actor", in_axes=(0,), out_axes=0)
    def scaled(x, *, lr, **hparams):
        return x * lr * hparams.get("clip", 1.0)

    with pytest.raises(fragc.FragmentError, match=r"fragment 'scaled' called at .*test_frontend_errors.py:\d+: "
                                                  r"keyword-only parameters \(lr\); \*\*hparams arguments "
                                                  r"\(clip\) cannot carry values between fragments; make each a "
                                                  r"positional-or-keyword parameter"):
        scaled(jnp.ones(3), lr=0.1, clip=0.5)


def test_a_fragment_under_a_batched_lax_map_is_refused_naming_lax_map():
    @fragc.fragment(role="actor", in_axes=(0,), out_axes=0)
    def double(x):
        return 2 * x

    class Mapped:
        def init(self, key):
            return jnp.ones((4, 8))

        def iteration(self, xs):
            return jax.lax.map(double, xs, batch_size=2), {}

    with pytest.raises(fragc.FragmentError, match=r"fragment 'double' is called under a jax.vmap of your own, or a "
                                                  r"lax.map with a batch_size \(which vmaps its batches\)"):
        fragc.trace(Mapped())


def test_collective_outside_a_fragment():
    with pytest.raises(fragc.FragcError, match=r"fragc.pmean must be called inside a @fragc.fragment"):
        fragc.pmean(jnp.ones(3))


def test_fragment_closing_over_a_traced_value():
    class Leaky:
        def init(self, key):
            return jnp.ones(4)

        def iteration(self, x):
            scale = jnp.sum(x)

            @fragc.fragment(role="actor", in_axes=(0,), out_axes=0)
            def leak(y):
                return y * scale

            return leak(x), {}

    with pytest.raises(fragc.FragmentError, match=r"fragment 'leak' \(tests/test_frontend_errors.py:\d+\) closes over a value traced outside it"):
        fragc.trace(Leaky())


def test_warns_when_a_replicated_key_is_split_per_environment():
    @fragc.fragment(role="actor", in_axes=(None, 0), out_axes=0)
    def noisy(key, obs):
        keys = jax.random.split(key, obs.shape[0])
        return obs + jax.vmap(lambda k: jax.random.normal(k))(keys)

    with pytest.warns(UserWarning, match=r"fragment 'noisy' splits a replicated key into 8 keys"):
        noisy(jax.random.key(0), jnp.zeros(8))


def _split_in_scan(key, obs):
    def step(key, _):
        key, sub = jax.random.split(key)
        return key, jax.vmap(jax.random.normal)(jax.random.split(sub, obs.shape[0]))

    return obs + jax.lax.scan(step, key, None, 3)[1].sum(0)


def _categorical_in_scan(key, obs):
    """PureJaxRL's rollout: `pi.sample(seed=_rng)` on a batch of logits with the runner's one key."""
    def step(key, _):
        key, sub = jax.random.split(key)
        return key, jax.random.categorical(sub, jnp.stack([obs, -obs], axis=-1))

    return obs + jax.lax.scan(step, key, None, 3)[1].sum(0)


def _normal_noise(key, obs):
    return obs + jax.random.normal(key, obs.shape)


@pytest.mark.parametrize("body, what", [
    (_split_in_scan, r"splits a replicated key into 8 keys"),
    (_categorical_in_scan, r"samples random numbers of shape \[8, 2\] \(one per environment\) from a replicated key"),
    (_normal_noise, r"samples random numbers of shape \[8\]"),
])
def test_warns_when_per_environment_noise_comes_from_a_replicated_key(body, what):
    frag = fragc.fragment(role="actor", in_axes=(None, 0), out_axes=0)(body)
    with pytest.warns(UserWarning, match=rf"fragment '{body.__name__}' {what}.* \(at .*test_frontend_errors.py:\d+"):
        jax.eval_shape(frag, jax.random.key(0), jnp.zeros(8))


def test_per_environment_keys_do_not_warn(recwarn):
    """Keys carried per environment through a scan, a replicated key that shuffles a batch that is not
    per environment (PPO's minibatches) or draws a size that equals the environment count by chance,
    keys made per replica from `axis_index`, and one environment's draws (a length-1 dimension is not one per
    environment)."""
    @fragc.fragment(role="actor", in_axes=(None, 0, 0), out_axes=0)
    def per_env(key, keys, obs):
        def step(keys, _):
            keys = jax.vmap(jax.random.split)(keys)
            return keys[:, 0], jax.vmap(jax.random.normal)(keys[:, 1])

        noise = jax.lax.scan(step, keys, None, 3)[1]  # [3, 8]
        order = jax.random.permutation(key, noise.size)
        return obs + noise.reshape(-1)[order].reshape(noise.shape).sum(0)

    @fragc.fragment(role="actor", in_axes=(None, 0), out_axes=0)
    def per_replica(key, obs):
        key = jax.random.fold_in(key, jax.lax.axis_index(fragc.REPLICA))
        return obs + jax.random.normal(key, obs.shape)

    @fragc.fragment(role="buffer", in_axes=(None, 0), out_axes=None)
    def sample_eight(key, obs):  # as DQN's buffer: 8 draws, whatever the environment count (8 by chance)
        return fragc.pmean(obs[jax.random.randint(key, (8,), 0, obs.shape[0])].sum())

    fragc.trace(Regression(num_envs=8))
    jax.eval_shape(sample_eight, jax.random.key(0), jnp.zeros(8))
    jax.eval_shape(per_env, jax.random.key(0), jax.random.split(jax.random.key(1), 8), jnp.zeros(8))
    jax.eval_shape(per_replica, jax.random.key(0), jnp.zeros(8))  # traces, runs nothing

    @fragc.fragment(role="buffer", in_axes=(None, 0), out_axes=None)
    def one_batch_of_four(key, obs):  # as SAC's buffer: [batches an iteration = 1, batch = 4] draws
        return fragc.pmean(obs[jax.random.randint(key, (1, 4), 0, obs.shape[0])].sum())

    jax.eval_shape(one_batch_of_four, jax.random.key(0), jnp.zeros(1))  # one environment (CleanRL's SAC): a
    # replica at most, and the draws' length-1 dimension is not one per environment
    assert not [w for w in recwarn if "replicated key" in str(w.message)]


def test_not_an_algorithm():
    with pytest.raises(fragc.FragcError, match=r"object is not an algorithm: it has no method 'init"):
        fragc.trace(object())


def test_a_state_leaf_changing_dtype_is_named():
    """PureJaxRL's LogWrapper starts an episode return as the int 0; iteration makes it a float."""
    class Returns:
        def init(self, key):
            return {"returns": jnp.zeros((4,), jnp.int32), "key": key}

        def iteration(self, state):
            return {**state, "returns": state["returns"] + 0.5}, {}

    with pytest.raises(fragc.FragcError, match=r"Returns.iteration changes state leaf state\['returns'\] from "
                                               r"int32\[4\] to float32\[4\].*jnp.zeros\(\(4,\), jnp.float32\)"):
        fragc.trace(Returns())


class _Printing:
    """PureJaxRL's DEBUG callback: `jax.debug.callback` on the metrics, in the update step."""

    def __init__(self, effect):
        self.effect = effect

    def init(self, key):
        return {"x": jnp.zeros(4)}

    @fragc.fragment(role="actor", in_axes=(0,), out_axes=(0, None))
    def step(self, x):
        jax.debug.callback(lambda m: None, x.sum())  # inside a fragment: allowed
        return x + 1, {"mean": fragc.pmean(x.mean())}

    def iteration(self, state):
        x, metrics = self.step(state["x"])
        self.effect(metrics)
        return {"x": x}, metrics


@pytest.mark.parametrize("effect, name", [
    (lambda m: jax.debug.print("{}", m["mean"]), "jax.debug.print"),
    (lambda m: jax.debug.callback(print, m), "jax.debug.callback"),
    (lambda m: jax.lax.scan(lambda c, _: (jax.debug.print("{}", c) or c, None), m["mean"], None, 2),
     "jax.debug.print"),
])
def test_an_effect_outside_fragments_is_refused_not_dropped(effect, name):
    with pytest.raises(fragc.FragcError, match=rf"_Printing.iteration calls {name} outside any fragment "
                                               r"\(at .*test_frontend_errors.py:\d+.*\); .*inside a @fragc.fragment, "
                                               r"or return the value as a metric"):
        fragc.trace(_Printing(effect))


def test_an_effect_inside_a_fragment_runs(capfd):
    """The refusal is for glue only: a callback inside a fragment runs (here in the reference interpreter)."""
    seen = []

    class Recording(_Printing):
        @fragc.fragment(role="actor", in_axes=(0,), out_axes=(0, None))
        def step(self, x):
            jax.debug.callback(seen.append, x.sum())
            return x + 1, {"mean": fragc.pmean(x.mean())}

    algo = Recording(lambda m: None)
    fragc.interpret(fragc.trace(algo), algo.init(jax.random.key(0)), replicas=1)
    jax.effects_barrier()
    assert [float(s) for s in seen] == [0.0]


class _PerReplica:
    """An actor whose body works only with one replica: a size from the config, or a wrong axis."""

    num_envs, num_steps = 8, 4

    def __init__(self, body, in_axes=(0,)):
        self.step = fragc.fragment(role="actor", in_axes=in_axes, out_axes=0)(body)

    def init(self, key):
        return {"obs": jnp.zeros((self.num_steps, self.num_envs))}

    def iteration(self, state):
        return {"obs": state["obs"]}, {"mean": self.step(state["obs"]).mean()}


def test_a_body_using_a_config_size_is_one_warning_line_under_one_replica_and_refused_under_several():
    """A PureJaxRL port that sizes by the config (`reshape(T * NUM_ENVS)`) runs under `single`: it is told in one
    line what several replicas would break; a policy that runs several refuses it with the same words."""
    def flatten(obs):  # [T, n] declared with its environment axis 1
        return obs.reshape(_PerReplica.num_steps * _PerReplica.num_envs)

    algo = _PerReplica(flatten, in_axes=(1,))
    with pytest.warns(UserWarning) as said:
        prog = fragc.compile(algo, policy="single", devices=1)  # the check traces while XLA compiles
    [line] = [str(w.message) for w in said]
    assert re.fullmatch(r"fragment 'flatten' traced with 2 replicas, .*each seeing 1/2 of every declared axis \(obs "
                        r"f32\[4,8@env\] -> f32\[4,4\]\): its body fails: cannot reshape .*take batch sizes from the "
                        r"arguments' shapes.* \(it runs with one replica here; a policy that runs it with several "
                        r"refuses it\)", line), line
    _, history = prog.run(prog.init(0), 1)
    assert history["mean"].shape == (1,)
    with pytest.raises(fragc.FragmentError, match=r"fragment 'flatten' traced with 2 replicas, .*obs f32\[4,8@env\] "
                                                  r"-> f32\[4,4\]"):
        fragc.compile(algo, policy="anakin", devices=2)
    with pytest.raises(fragc.FragmentError, match=r"fragment 'flatten' traced with 4 replicas, .*obs f32\[4,8@env\] "
                                                  r"-> f32\[4,2\]"):
        fragc.interpret(fragc.trace(algo), algo.init(jax.random.key(0)), replicas=4)


def test_a_wrong_axis_declaration_is_one_warning_line_under_single():
    def per_env_mean(obs):  # [T, n], but declared with its environment axis 0
        return obs.mean(axis=0)

    with pytest.warns(UserWarning, match=r"fragment 'per_env_mean' traced with 2 replicas, .*it returns result 0 as "
                                         r"f32\[8\], but f32\[8@env\] declared out_axes 0 makes it f32\[4\] per "
                                         r"replica.*a policy that runs it with several refuses it"):
        fragc.compile(_PerReplica(per_env_mean), policy="single", devices=1)


def test_a_carry_changing_dtype_in_a_fragments_scan_is_named():
    """LogWrapper's int episode returns, accumulated with float rewards inside the rollout's scan."""
    @fragc.fragment(role="actor", in_axes=(0, 0), out_axes=0)
    def rollout(log, obs):
        def step(returns, _):
            return returns + obs * 0.5, None

        return jax.lax.scan(step, log["returns"], None, 3)[0]

    with pytest.raises(fragc.FragmentError, match=r"fragment 'rollout': the lax.scan at .*test_frontend_errors.py:\d+ "
                                                  r"turns its carry returns from int32\[8\] into float32\[8\]; arguments "
                                                  r"of dtype int32: log.returns\. .*jnp.zeros\(shape, jnp.float32\)"):
        jax.eval_shape(rollout, {"returns": jnp.zeros(8, jnp.int32)}, jnp.zeros(8))
