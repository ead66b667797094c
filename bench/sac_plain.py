"""A rewrite, not the reference (CleanRL's own JAX SAC builds in bench/references/, where torch is installed): SAC
written the way CleanRL writes it (cleanrl/sac_continuous_action.py), in plain JAX and independently of
fragc's SAC, timed against `fragc run sac`'s program (policy single).

The plain side: closures over one `make_train`, flax `TrainState`s for the actor and for the twin critics (their
parameters stacked, as CleanRL's two `SoftQNetwork`s under one optimizer), a target-parameter copy, one PRNG key
split per step (and split again over the environments), gymnax's `LogWrapper`, a flat ring buffer of
`buffer_size` transitions over all environments (CleanRL's `ReplayBuffer`; the true next observation stored on a
truncation), then per iteration `gradient_steps` updates of critics, actor, temperature and Polyak targets, each
with its batch sampled uniformly from what was written, the whole iteration one `lax.scan` step. Only the
hyperparameters are read from a `sac.Config`, so both sides train the same configuration (CleanRL's SAC with 8
environments, 1 step each, 8 gradient steps an iteration, batch 256, 256x256 networks, Pendulum-v1), with
`learning_starts` 0 for the timing, so every timed iteration learns.

Sides, timed alternately (A B C D E A B C D E ...) in one process, each scanning the same number of iterations per
dispatch and fetching its metrics after every dispatch:
- `fragc`: `fragc.compile(SAC(config), "single")`, what `fragc run sac` runs (on a GPU its learner's loop over the
  iteration's gradient steps is unrolled: `sac.Config.unroll`);
- `fragc_rolled`: the same with `unroll=1`, the loop rolled;
- `plain_jit`: `jax.jit(lax.scan(algo.iteration))` of fragc's own SAC (fragc's lowering alone);
- `cleanrl`: the independent plain-JAX SAC below, its update loop a rolled `lax.scan` as PureJaxRL writes loops;
- `cleanrl_unrolled`: the same with the update loop unrolled as fragc's is (the same XLA freedom on both sides).

    python bench/sac_plain.py [--repeats 5] [--iterations 64] [--k 16] [--learn] [--out bench/results]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState

import fragc
from fragc.algos import sac

SIDES = ("fragc", "fragc_rolled", "plain_jit", "cleanrl", "cleanrl_unrolled")
LOG_STD_MAX, LOG_STD_MIN = 2.0, -5.0
TORCH_LINEAR = nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform")  # torch nn.Linear's weights


class SoftQNetwork(nn.Module):
    hidden: int

    @nn.compact
    def __call__(self, x: jax.Array, a: jax.Array) -> jax.Array:
        x = jnp.concatenate([x, a], -1)
        x = nn.relu(nn.Dense(self.hidden, kernel_init=TORCH_LINEAR)(x))
        x = nn.relu(nn.Dense(self.hidden, kernel_init=TORCH_LINEAR)(x))
        return nn.Dense(1, kernel_init=TORCH_LINEAR)(x)


class Actor(nn.Module):
    action_dim: int
    hidden: int

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = nn.relu(nn.Dense(self.hidden, kernel_init=TORCH_LINEAR)(x))
        x = nn.relu(nn.Dense(self.hidden, kernel_init=TORCH_LINEAR)(x))
        mean = nn.Dense(self.action_dim, kernel_init=TORCH_LINEAR)(x)
        log_std = jnp.tanh(nn.Dense(self.action_dim, kernel_init=TORCH_LINEAR)(x))
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)
        return mean, log_std


class ReplayBuffer(NamedTuple):
    obs: jax.Array  # [buffer_size, obs_dim]
    next_obs: jax.Array
    actions: jax.Array
    rewards: jax.Array
    dones: jax.Array  # terminations only: a truncation bootstraps
    pos: jax.Array
    full: jax.Array


class RunnerState(NamedTuple):
    actor: TrainState
    qf: TrainState  # both critics' parameters, stacked
    qf_target: Any
    alpha: TrainState  # params: {"log_alpha": log alpha}
    rb: ReplayBuffer
    obs: jax.Array
    env_state: Any
    global_step: jax.Array
    rng: jax.Array


class Train(NamedTuple):
    init: Callable  # rng -> runner_state
    update_step: Callable  # (runner_state, _) -> (runner_state, metrics)


def make_train(c: sac.Config, unroll: int = 1) -> Train:
    """CleanRL's sac_continuous_action.py main loop as a jittable iteration of `num_steps` vector steps and
    `gradient_steps` updates (`unroll` of them unrolled in their `lax.scan`), with the hyperparameters of `c`."""
    import gymnax
    from gymnax.wrappers.purerl import FlattenObservationWrapper, LogWrapper

    env, env_params = gymnax.make(c.env)
    env = LogWrapper(FlattenObservationWrapper(env))
    space = env.action_space(env_params)
    action_dim = int(np.prod(space.shape))
    obs_dim = int(np.prod(env.observation_space(env_params).shape))
    action_scale = jnp.asarray((space.high - space.low) / 2.0, jnp.float32).reshape(-1)
    action_bias = jnp.asarray((space.high + space.low) / 2.0, jnp.float32).reshape(-1)
    target_entropy = -float(action_dim)
    actor, qf = Actor(action_dim, c.hidden), SoftQNetwork(c.hidden)

    def get_action(params, x, rng):
        mean, log_std = actor.apply(params, x)
        std = jnp.exp(log_std)
        x_t = mean + std * jax.random.normal(rng, mean.shape)  # rsample
        y_t = jnp.tanh(x_t)
        action = y_t * action_scale + action_bias
        log_prob = -0.5 * ((x_t - mean) / std) ** 2 - log_std - 0.5 * jnp.log(2 * jnp.pi)
        log_prob = jnp.sum(log_prob - jnp.log(action_scale * (1 - y_t**2) + 1e-6), -1)
        return action, log_prob

    def q_both(params, x, a):
        return jax.vmap(lambda p: qf.apply(p, x, a)[:, 0])(params)  # [2, batch]

    def init(rng):
        rng, k_actor, k_qf, k_env = jax.random.split(rng, 4)
        obs0 = jnp.zeros((1, obs_dim))
        actor_state = TrainState.create(apply_fn=actor.apply, params=actor.init(k_actor, obs0),
                                        tx=optax.adam(c.policy_lr))
        qf_params = jax.vmap(qf.init, in_axes=(0, None, None))(jax.random.split(k_qf), obs0,
                                                              jnp.zeros((1, action_dim)))
        qf_state = TrainState.create(apply_fn=qf.apply, params=qf_params, tx=optax.adam(c.q_lr))
        alpha_state = TrainState.create(apply_fn=None, params={"log_alpha": jnp.zeros(())},
                                        tx=optax.adam(c.alpha_lr))
        n = c.buffer_size
        rb = ReplayBuffer(jnp.zeros((n, obs_dim)), jnp.zeros((n, obs_dim)), jnp.zeros((n, action_dim)),
                          jnp.zeros(n), jnp.zeros(n), jnp.int32(0), jnp.bool_(False))
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_env, c.num_envs), env_params)
        return RunnerState(actor_state, qf_state, qf_params, alpha_state, rb, obs, env_state, jnp.int32(0), rng)

    def update(carry, rng):
        actor_state, qf_state, qf_target, alpha_state, rb = carry
        k_idx, k_next, k_pi, k_alpha = jax.random.split(rng, 4)
        size = jnp.where(rb.full, c.buffer_size, rb.pos)
        idx = jax.random.randint(k_idx, (c.batch_size,), 0, size)
        obs, next_obs, actions = rb.obs[idx], rb.next_obs[idx], rb.actions[idx]
        rewards, dones = rb.rewards[idx], rb.dones[idx]
        alpha = jnp.exp(alpha_state.params["log_alpha"]) if c.autotune else c.alpha

        next_actions, next_log_pi = get_action(actor_state.params, next_obs, k_next)
        min_qf_next = jnp.min(q_both(qf_target, next_obs, next_actions), 0) - alpha * next_log_pi
        next_q_value = rewards + (1 - dones) * c.gamma * min_qf_next

        def qf_loss_fn(params):
            q = q_both(params, obs, actions)
            return jnp.mean((q[0] - next_q_value) ** 2) + jnp.mean((q[1] - next_q_value) ** 2)

        qf_loss, grads = jax.value_and_grad(qf_loss_fn)(qf_state.params)
        qf_state = qf_state.apply_gradients(grads=grads)

        def actor_loss_fn(params):
            pi, log_pi = get_action(params, obs, k_pi)
            return jnp.mean(alpha * log_pi - jnp.min(q_both(qf_state.params, obs, pi), 0))

        actor_loss, grads = jax.value_and_grad(actor_loss_fn)(actor_state.params)
        actor_state = actor_state.apply_gradients(grads=grads)

        if c.autotune:
            _, log_pi = get_action(actor_state.params, obs, k_alpha)
            grad = jax.grad(lambda p: jnp.mean(-jnp.exp(p["log_alpha"]) * (log_pi + target_entropy)))(
                alpha_state.params)
            alpha_state = alpha_state.apply_gradients(grads=grad)

        qf_target = jax.tree.map(lambda p, t: c.tau * p + (1 - c.tau) * t, qf_state.params, qf_target)
        return (actor_state, qf_state, qf_target, alpha_state, rb), (qf_loss, actor_loss)

    def update_step(runner_state, unused):
        rs = runner_state

        def _env_step(carry, _):
            rb, obs, env_state, global_step, rng = carry
            rng, k_act, k_random, k_step = jax.random.split(rng, 4)
            policy_actions, _ = get_action(rs.actor.params, obs, k_act)
            random_actions = jax.random.uniform(k_random, policy_actions.shape, minval=-1.0, maxval=1.0)
            actions = jnp.where(global_step < c.learning_starts, random_actions * action_scale + action_bias,
                                policy_actions)
            next_obs, env_state, reward, terminated, truncated, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(k_step, c.num_envs), env_state, actions.reshape((c.num_envs,) + space.shape),
                env_params)
            real_next_obs = info["final_observation"].reshape(c.num_envs, -1)
            slots = (rb.pos + jnp.arange(c.num_envs)) % c.buffer_size
            rb = rb._replace(obs=rb.obs.at[slots].set(obs), next_obs=rb.next_obs.at[slots].set(real_next_obs),
                             actions=rb.actions.at[slots].set(actions), rewards=rb.rewards.at[slots].set(reward),
                             dones=rb.dones.at[slots].set(terminated.astype(jnp.float32)),
                             pos=(rb.pos + c.num_envs) % c.buffer_size,
                             full=rb.full | (rb.pos + c.num_envs >= c.buffer_size))
            return (rb, next_obs, env_state, global_step + c.num_envs, rng), info

        (rb, obs, env_state, global_step, rng), info = jax.lax.scan(
            _env_step, (rs.rb, rs.obs, rs.env_state, rs.global_step, rs.rng), None, c.num_steps)

        rng, k_updates = jax.random.split(rng)
        carry = (rs.actor, rs.qf, rs.qf_target, rs.alpha, rb)
        carry, (qf_loss, actor_loss) = jax.lax.cond(
            global_step > c.learning_starts,
            lambda carry: jax.lax.scan(update, carry, jax.random.split(k_updates, c.gradient_steps), unroll=unroll),
            lambda carry: (carry, (jnp.zeros(c.gradient_steps), jnp.zeros(c.gradient_steps))), carry)
        actor_state, qf_state, qf_target, alpha_state, rb = carry
        returned = info["returned_episode"]
        metrics = {"qf_loss": qf_loss.mean(), "actor_loss": actor_loss.mean(),
                   "episode_return": jnp.sum(info["returned_episode_returns"] * returned)
                   / jnp.maximum(jnp.sum(returned), 1)}
        return RunnerState(actor_state, qf_state, qf_target, alpha_state, rb, obs, env_state, global_step,
                           rng), metrics

    return Train(init, update_step)


def fused(config: sac.Config, k: int, unroll: int = 1) -> tuple[Callable, Any]:
    """(jitted init, jitted k-iteration scan of the plain SAC, state donated)."""
    train = make_train(config, unroll)
    return (jax.jit(train.init),
            jax.jit(lambda s: jax.lax.scan(train.update_step, s, None, k), donate_argnums=0))


def dispatched(step: Callable, iterations: int, k: int) -> Callable:
    """`state -> state` after `iterations` iterations as `iterations // k` calls of `step` (k iterations a call,
    its input donated, so it runs on a copy), each call's metrics fetched as `fragc`'s runs fetch them."""
    def run(state):
        state = jax.tree.map(jnp.copy, state)
        for _ in range(iterations // k):
            state, metrics = step(state)
            jax.device_get(metrics)
        return state
    return run


def plain_jit(algo: sac.SAC, k: int):
    """`k` iterations of fragc's SAC in one `jax.jit(lax.scan(...))` (outside a trace a fragment is a function)."""
    return jax.jit(lambda s: jax.lax.scan(lambda s, _: algo.iteration(s), s, None, k), donate_argnums=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=64, help="iterations timed per repeat")
    parser.add_argument("--k", type=int, default=16, help="iterations per dispatch, every side")
    parser.add_argument("--buffer-size", type=int, default=sac.Config.buffer_size)
    parser.add_argument("--learn", action="store_true",
                        help="also run the plain SAC for the default config's whole budget and print its final return")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()

    config = sac.Config(learning_starts=0, buffer_size=args.buffer_size)
    algo = sac.SAC(config)
    steps = config.steps_per_iteration
    start = time.perf_counter()
    prog = fragc.compile(algo, "single", iterations_per_dispatch=args.k)
    state = jax.block_until_ready(prog.init(0))
    compile_fragc = time.perf_counter() - start
    jitted = plain_jit(algo, args.k).lower(state).compile()
    rolled = fragc.compile(sac.SAC(dataclasses.replace(config, unroll=1)), "single", iterations_per_dispatch=args.k)
    start = time.perf_counter()
    init, train = fused(config, args.k)
    plain_state = init(jax.random.key(0))
    train = train.lower(plain_state).compile()
    compile_plain = time.perf_counter() - start
    _, unrolled = fused(config, args.k, unroll=config.gradient_steps)
    unrolled = unrolled.lower(plain_state).compile()

    sides = {"fragc": (state, lambda s: prog.run(s, args.iterations)[0]),
             "fragc_rolled": (state, lambda s: rolled.run(s, args.iterations)[0]),
             "plain_jit": (state, dispatched(jitted, args.iterations, args.k)),
             "cleanrl": (plain_state, dispatched(train, args.iterations, args.k)),
             "cleanrl_unrolled": (plain_state, dispatched(unrolled, args.iterations, args.k))}
    states = {name: run(s) for name, (s, run) in sides.items()}  # warm up
    times: dict[str, list[float]] = {name: [] for name in SIDES}
    for _ in range(args.repeats):
        for name in SIDES:
            start = time.perf_counter()
            jax.block_until_ready(sides[name][1](states[name]))
            times[name].append(time.perf_counter() - start)
    sps = {n: [args.iterations * steps / t for t in ts] for n, ts in times.items()}
    ratios = {f"src/fragc/{b}": [a / c for a, c in zip(sps["fragc"], sps[b])] for b in SIDES[1:]}
    result = {
        "config": {"env": config.env, "num_envs": config.num_envs, "num_steps": config.num_steps,
                   "gradient_steps": config.gradient_steps, "batch_size": config.batch_size,
                   "hidden": config.hidden, "learning_starts": config.learning_starts,
                   "fragc_unrolled_steps": algo.unrolled_steps,
                   "iterations_per_repeat": args.iterations, "iterations_per_dispatch": args.k,
                   "repeats": args.repeats, "backend": jax.default_backend(), "device": str(jax.devices()[0]),
                   "load_average": os.getloadavg()},
        "env_steps_per_s": {n: statistics.median(v) for n, v in sps.items()},
        "env_steps_per_s_each": sps,
        "ratio_median": {n: statistics.median(r) for n, r in ratios.items()},
        "ratios": ratios,
        "compile_s_warm_process": {"fragc": compile_fragc, "cleanrl": compile_plain},
    }
    print(f"{'':18}{'env-steps/s (median)':>22}")
    for n in SIDES:
        print(f"{n:18}{result['env_steps_per_s'][n]:>22.0f}")
    for n, r in ratios.items():
        print(f"throughput ratio {n}: median {statistics.median(r):.3f} (min {min(r):.3f}, max {max(r):.3f})")
    if args.learn:
        whole_config = sac.Config()
        init, whole = fused(whole_config, whole_config.iterations)
        _, metrics = whole(init(jax.random.key(0)))
        returns = np.asarray(metrics["episode_return"])
        result["cleanrl_final_return"] = float(returns[-125:].mean())
        print(f"CleanRL-style SAC, {whole_config.iterations} iterations: mean episode return of the last 1000 steps "
              f"{result['cleanrl_final_return']:.1f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sac_plain.json"), "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
