"""Compiled single-device PPO (fragc) against a hand-fused PPO in one jitted function.

Both run the same configuration (PureJaxRL's CartPole-v1), scan the same number
of iterations per dispatch, and are timed alternately in one process
(A B A B ...), so drift hits both. Prints medians and the ratio; writes JSON.

    python bench/ppo_single.py [--repeats 7] [--iterations 128] [--compile-repeats 3] [--out bench/results]

Compile time is measured cold, each compile in a new process (alternating
sides), because in one process whichever side compiles second finds JAX's
caches warm.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import optax

import fragc
from fragc.algos import ppo


def hand_fused(algo: ppo.PPO, k: int):
    """PureJaxRL-style: rollout and update written inline, no fragments, one jit."""
    c, env, net = algo.config, algo.env, algo.network

    def iteration(state: ppo.State, _):
        params = state.learner.params

        def step(runner, _):
            keys = jax.vmap(jax.random.split)(runner.key)
            logits, value = net.apply(params, runner.obs)
            action = jax.vmap(jax.random.categorical)(keys[:, 0], logits)
            log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], -1)[:, 0]
            obs = runner.obs
            runner, out = env.step(runner.replace(key=keys[:, 1]), action)
            _, next_value = net.apply(params, out.final_obs)
            return runner, ppo.Transition(obs, action, log_prob, value, out.final_obs, next_value, out.reward,
                                          out.terminated, out.episode_done)

        runner, traj = jax.lax.scan(step, state.runner, None, c.num_steps)
        advantages, targets = ppo.gae(traj, c.gamma, c.gae_lambda)
        batch = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), (traj, advantages, targets))

        def minibatch(learner, mb):
            grads, metrics = jax.grad(algo._loss, has_aux=True)(learner.params, *mb)
            updates, opt_state = algo.optimizer.update(grads, learner.opt_state, learner.params)
            return learner.replace(params=optax.apply_updates(learner.params, updates), opt_state=opt_state), metrics

        def epoch(learner, _):
            key, sub = jax.random.split(learner.key)
            perm = jax.random.permutation(sub, advantages.size)
            mbs = jax.tree.map(lambda x: x[perm].reshape((c.num_minibatches, -1) + x.shape[1:]), batch)
            return jax.lax.scan(minibatch, learner.replace(key=key), mbs)

        learner, metrics = jax.lax.scan(epoch, state.learner, None, c.update_epochs)
        completed = jnp.sum(runner.has_return)
        ret = jnp.sum(runner.last_return * runner.has_return) / jnp.maximum(completed, 1)
        return ppo.State(learner, runner), {"episode_return": ret, **jax.tree.map(jnp.mean, metrics)}

    return jax.jit(lambda s: jax.lax.scan(iteration, s, None, k), donate_argnums=0)


def compile_seconds(which: str) -> float:
    """Trace, lower and compile one side in this (fresh) process; what a user waits for at start-up."""
    algo = ppo.PPO(ppo.Config())
    state = jax.eval_shape(algo.init, jax.random.key(0))
    start = time.perf_counter()
    if which == "fragc":
        fragc.compile(algo, "single", iterations_per_dispatch=16)
    else:
        hand_fused(algo, 16).lower(state).compile()
    return time.perf_counter() - start


def cold_compile_times(repeats: int) -> dict[str, list[float]]:
    """Each compile in a new process (no warm JAX caches), alternating sides."""
    times: dict[str, list[float]] = {"fragc": [], "hand_fused": []}
    for _ in range(repeats):
        for which in times:
            out = subprocess.run([sys.executable, __file__, "--compile-only", which], capture_output=True, text=True,
                                 check=True, env={**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "")})
            times[which].append(float(out.stdout.strip().splitlines()[-1]))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile-only", choices=("fragc", "hand_fused"), help=argparse.SUPPRESS)
    parser.add_argument("--compile-repeats", type=int, default=3, help="cold compiles per side, each in a new process")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--iterations", type=int, default=128, help="iterations timed per repeat")
    parser.add_argument("--k", type=int, default=16, help="iterations per dispatch, both sides")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    if args.compile_only:
        print(compile_seconds(args.compile_only))
        return

    algo = ppo.PPO(ppo.Config())
    steps = algo.config.steps_per_iteration

    prog = fragc.compile(algo, "single", iterations_per_dispatch=args.k)
    state0 = prog.init(0)
    fused = hand_fused(algo, args.k).lower(state0).compile()
    compiles = cold_compile_times(args.compile_repeats)
    fragc_compile, fused_compile = (statistics.median(compiles[k]) for k in ("fragc", "hand_fused"))

    def run_fragc(state):
        state, history = prog.run(state, args.iterations)
        return state

    def run_fused(state):
        state = jax.tree.map(jnp.copy, state)
        for _ in range(args.iterations // args.k):
            state, metrics = fused(state)
            jax.device_get(metrics)
        return state

    a_state, b_state = run_fragc(state0), run_fused(state0)  # warm up
    times = {"fragc": [], "hand_fused": []}
    for _ in range(args.repeats):
        for name, fn in (("fragc", run_fragc), ("hand_fused", run_fused)):
            start = time.perf_counter()
            out = fn(a_state if name == "fragc" else b_state)
            jax.block_until_ready(out)
            times[name].append(time.perf_counter() - start)
    sps = {n: [args.iterations * steps / t for t in ts] for n, ts in times.items()}
    ratios = [a / b for a, b in zip(sps["fragc"], sps["hand_fused"])]
    result = {
        "config": {"env": algo.config.env, "num_envs": algo.config.num_envs, "num_steps": algo.config.num_steps,
                   "iterations_per_repeat": args.iterations, "iterations_per_dispatch": args.k,
                   "repeats": args.repeats, "backend": jax.default_backend()},
        "env_steps_per_s": {n: statistics.median(v) for n, v in sps.items()},
        "ratio_median": statistics.median(ratios),
        "ratios": ratios,
        "compile_s": {"fragc": fragc_compile, "hand_fused": fused_compile},
        "compile_s_each": compiles,
        "compile_ratio": fragc_compile / fused_compile,
    }
    print(f"{'':12}{'env-steps/s (median)':>22}{'compile s (cold, median)':>26}")
    for n in ("fragc", "hand_fused"):
        print(f"{n:12}{result['env_steps_per_s'][n]:>22.0f}{result['compile_s'][n]:>26.2f}")
    print(f"throughput ratio fragc/hand-fused: median {result['ratio_median']:.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}); compile ratio {result['compile_ratio']:.2f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ppo_single.json"), "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
