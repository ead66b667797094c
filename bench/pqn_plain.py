"""A rewrite, not the reference (purejaxql's own pqn_gymnax.py is bench/pqn_reference.py's baseline): PQN written
the way purejaxql writes it (purejaxql/pqn_gymnax.py), independently of fragc's PQN, timed against
`fragc run pqn`'s program (policy single).

The plain side: closures over one `make_train`, a flax `TrainState`, one PRNG key split per step (and split
again over the environments), gymnax's `LogWrapper`, the Q(lambda) targets computed backwards from each
step's stored Q values with every episode end taken as terminal (purejaxql ignores truncation, so it needs no
second network pass over the observations reached), then `num_epochs` x `num_minibatches` RAdam steps, the
whole iteration one `lax.scan` step. Only the hyperparameters are read from a `pqn.Config`, so both sides train
the same configuration (purejaxql's CartPole-v1: 32 environments x 64 steps, 4 epochs of 16 minibatches).

Sides, timed alternately (A B C A B C ...) in one process, each scanning the same number of iterations per
dispatch and fetching its metrics after every dispatch:
- `fragc`: `fragc.compile(PQN(Config()), "single")`, what `fragc run pqn` runs;
- `plain_jit`: `jax.jit(lax.scan(algo.iteration))` of fragc's own PQN (fragc's lowering alone);
- `purejaxql`: the independent plain-JAX PQN below.

    python bench/pqn_plain.py [--repeats 7] [--iterations 64] [--k 16] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training.train_state import TrainState

import fragc
from fragc.algos import pqn

SIDES = ("fragc", "plain_jit", "purejaxql")


class QNetwork(nn.Module):
    action_dim: int
    hidden_size: int = 256
    num_layers: int = 2

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for _ in range(self.num_layers):
            x = nn.relu(nn.LayerNorm()(nn.Dense(self.hidden_size)(x)))
        return nn.Dense(self.action_dim)(x)


class Transition(NamedTuple):
    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    done: jax.Array
    q_val: jax.Array
    info: Any


class CustomTrainState(TrainState):
    n_updates: jax.Array


class Train(NamedTuple):
    init: Callable  # rng -> runner_state
    update_step: Callable  # (runner_state, _) -> (runner_state, metrics)


def make_train(c: pqn.Config) -> Train:
    """purejaxql's `make_train` for gymnax (pqn_gymnax.py), with the hyperparameters of `c`."""
    import gymnax
    from gymnax.wrappers.purerl import FlattenObservationWrapper, LogWrapper

    num_updates = c.total_steps // c.num_steps // c.num_envs
    env, env_params = gymnax.make(c.env)
    env = LogWrapper(FlattenObservationWrapper(env))
    network = QNetwork(env.action_space(env_params).n, c.hidden, c.num_layers)
    eps_scheduler = optax.linear_schedule(c.eps_start, c.eps_finish, c.eps_decay * num_updates)
    lr = (optax.linear_schedule(c.lr, 1e-20, num_updates * c.num_minibatches * c.num_epochs)
          if c.lr_linear_decay else c.lr)
    tx = optax.chain(optax.clip_by_global_norm(c.max_grad_norm), optax.radam(learning_rate=lr))

    def eps_greedy_exploration(rng, q_vals, eps):
        rng_a, rng_e = jax.random.split(rng)
        greedy_actions = jnp.argmax(q_vals, axis=-1)
        return jnp.where(jax.random.uniform(rng_e, greedy_actions.shape) < eps,
                         jax.random.randint(rng_a, greedy_actions.shape, 0, q_vals.shape[-1]), greedy_actions)

    def init(rng):
        rng, _rng = jax.random.split(rng)
        params = network.init(_rng, jnp.zeros((1, *env.observation_space(env_params).shape)))
        train_state = CustomTrainState.create(apply_fn=network.apply, params=params, tx=tx, n_updates=jnp.int32(0))
        rng, _rng = jax.random.split(rng)
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(_rng, c.num_envs), env_params)
        return train_state, (obs, env_state), rng

    def update_step(runner_state, unused):
        train_state, (last_obs, env_state), rng = runner_state

        # SAMPLE PHASE
        def _step_env(carry, _):
            last_obs, env_state, rng = carry
            rng, rng_a, rng_s = jax.random.split(rng, 3)
            q_vals = network.apply(train_state.params, last_obs)
            eps = jnp.full(c.num_envs, eps_scheduler(train_state.n_updates))
            action = jax.vmap(eps_greedy_exploration)(jax.random.split(rng_a, c.num_envs), q_vals, eps)
            obs, env_state, reward, terminated, truncated, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(rng_s, c.num_envs), env_state, action, env_params)
            done = jnp.logical_or(terminated, truncated)
            return (obs, env_state, rng), Transition(last_obs, action, c.reward_scale * reward, done, q_vals, info)

        rng, _rng = jax.random.split(rng)
        (last_obs, env_state, rng_unused), transitions = jax.lax.scan(
            _step_env, (last_obs, env_state, _rng), None, c.num_steps)

        # Q(LAMBDA) TARGETS, backwards from the Q of the last observation
        last_q = jnp.max(network.apply(train_state.params, last_obs), axis=-1)

        def _get_target(lambda_returns_and_next_q, transition):
            lambda_returns, next_q = lambda_returns_and_next_q
            target_bootstrap = transition.reward + c.gamma * (1 - transition.done) * next_q
            delta = lambda_returns - next_q
            lambda_returns = target_bootstrap + c.gamma * c.td_lambda * delta
            lambda_returns = (1 - transition.done) * lambda_returns + transition.done * transition.reward
            next_q = jnp.max(transition.q_val, axis=-1)
            return (lambda_returns, next_q), lambda_returns

        last_q = last_q * (1 - transitions.done[-1])
        lambda_returns = transitions.reward[-1] + c.gamma * last_q
        _, targets = jax.lax.scan(_get_target, (lambda_returns, last_q),
                                  jax.tree.map(lambda x: x[:-1], transitions), reverse=True)
        lambda_targets = jnp.concatenate((targets, lambda_returns[None]))

        # NETWORK UPDATE
        def _learn_epoch(carry, _):
            train_state, rng = carry

            def _learn_phase(train_state, minibatch):
                obs, action, target = minibatch

                def _loss_fn(params):
                    q_vals = network.apply(params, obs)
                    chosen = jnp.take_along_axis(q_vals, action[:, None], axis=-1)[:, 0]
                    return 0.5 * jnp.square(chosen - target).mean()

                loss, grads = jax.value_and_grad(_loss_fn)(train_state.params)
                return train_state.apply_gradients(grads=grads), loss

            def preprocess(x, rng):
                x = x.reshape(-1, *x.shape[2:])
                x = jax.random.permutation(rng, x)
                return x.reshape(c.num_minibatches, -1, *x.shape[1:])

            rng, _rng = jax.random.split(rng)
            minibatches = jax.tree.map(lambda x: preprocess(x, _rng),
                                       (transitions.obs, transitions.action, lambda_targets))
            train_state, loss = jax.lax.scan(_learn_phase, train_state, minibatches)
            return (train_state, rng), loss

        rng, _rng = jax.random.split(rng)
        (train_state, _), loss = jax.lax.scan(_learn_epoch, (train_state, _rng), None, c.num_epochs)
        train_state = train_state.replace(n_updates=train_state.n_updates + 1)
        info = transitions.info
        returned = info["returned_episode"]
        metrics = {"loss": loss.mean(),
                   "episode_return": jnp.sum(info["returned_episode_returns"] * returned)
                   / jnp.maximum(jnp.sum(returned), 1)}
        return (train_state, (last_obs, env_state), rng), metrics

    return Train(init, update_step)


def fused(config: pqn.Config, k: int) -> tuple[Callable, Any]:
    """(jitted init, jitted k-iteration scan of the plain PQN, state donated)."""
    train = make_train(config)
    return (jax.jit(train.init),
            jax.jit(lambda s: jax.lax.scan(train.update_step, s, None, k), donate_argnums=0))


def plain_jit(algo: pqn.PQN, k: int):
    """`k` iterations of fragc's PQN in one `jax.jit(lax.scan(...))` (outside a trace a fragment is a function)."""
    return jax.jit(lambda s: jax.lax.scan(lambda s, _: algo.iteration(s), s, None, k), donate_argnums=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--iterations", type=int, default=64, help="iterations timed per repeat")
    parser.add_argument("--k", type=int, default=16, help="iterations per dispatch, every side")
    parser.add_argument("--learn", action="store_true",
                        help="also run the plain PQN for its whole budget and print its final return")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()

    config = pqn.Config()
    algo = pqn.PQN(config)
    steps = config.steps_per_iteration
    start = time.perf_counter()
    prog = fragc.compile(algo, "single", iterations_per_dispatch=args.k)
    state = jax.block_until_ready(prog.init(0))
    compile_fragc = time.perf_counter() - start
    jitted = plain_jit(algo, args.k).lower(state).compile()
    start = time.perf_counter()
    init, train = fused(config, args.k)
    pj_state = init(jax.random.key(0))
    train = train.lower(pj_state).compile()
    compile_plain = time.perf_counter() - start

    def dispatches(step):
        def run(state):
            state = jax.tree.map(jnp.copy, state)  # the step donates its input
            for _ in range(args.iterations // args.k):
                state, metrics = step(state)
                jax.device_get(metrics)
            return state
        return run

    sides = {"fragc": (state, lambda s: prog.run(s, args.iterations)[0]),
             "plain_jit": (state, dispatches(jitted)),
             "purejaxql": (pj_state, dispatches(train))}
    states = {name: run(s) for name, (s, run) in sides.items()}  # warm up
    times: dict[str, list[float]] = {name: [] for name in SIDES}
    for _ in range(args.repeats):
        for name in SIDES:
            start = time.perf_counter()
            jax.block_until_ready(sides[name][1](states[name]))
            times[name].append(time.perf_counter() - start)
    sps = {n: [args.iterations * steps / t for t in ts] for n, ts in times.items()}
    ratios = {f"src/fragc/{b}": [a / c for a, c in zip(sps["fragc"], sps[b])] for b in ("purejaxql", "plain_jit")}
    result = {
        "config": {"env": config.env, "num_envs": config.num_envs, "num_steps": config.num_steps,
                   "num_epochs": config.num_epochs, "num_minibatches": config.num_minibatches,
                   "iterations_per_repeat": args.iterations, "iterations_per_dispatch": args.k,
                   "repeats": args.repeats, "backend": jax.default_backend(), "device": str(jax.devices()[0])},
        "env_steps_per_s": {n: statistics.median(v) for n, v in sps.items()},
        "env_steps_per_s_each": sps,
        "ratio_median": {n: statistics.median(r) for n, r in ratios.items()},
        "ratios": ratios,
        "compile_s_warm_process": {"fragc": compile_fragc, "purejaxql": compile_plain},
    }
    print(f"{'':12}{'env-steps/s (median)':>22}")
    for n in SIDES:
        print(f"{n:12}{result['env_steps_per_s'][n]:>22.0f}")
    for n, r in ratios.items():
        print(f"throughput ratio {n}: median {statistics.median(r):.3f} (min {min(r):.3f}, max {max(r):.3f})")
    if args.learn:
        init, whole = fused(config, config.iterations)
        _, metrics = whole(init(jax.random.key(0)))
        result["purejaxql_final_return"] = float(metrics["episode_return"][-1])
        print(f"purejaxql-style PQN, {config.iterations} iterations: final episode return "
              f"{result['purejaxql_final_return']:.1f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "pqn_plain.json"), "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
