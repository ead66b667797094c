"""IPPO written the way JaxMARL's baselines write it (baselines/IPPO/ippo_ff_mpe.py), against fragc's `ippo` under
`single`, timed alternately in one process.

The JaxMARL side is written here independently, in the style of JaxMARL's baselines/IPPO/ippo_ff_mpe.py: one
`make_train(config)` closure, the environment in JaxMARL's `MPELogWrapper` (its episode statistics ride in each
transition's `info` and are averaged every update), the agents' dicts batchified into one [A*N, ...] batch of
actors, a flax `TrainState`, every `done` terminal (no bootstrap), GAE scanned with `unroll=8`, and each epoch's
minibatches drawn from one permutation of all T x A*N steps (as the script does; JaxMARL's recurrent scripts
permute whole actor trajectories instead, which an earlier version of this bench did here: a cheaper shuffle than
the script this side stands for). Its per-update `io_callback` to wandb is left out: both sides fetch their
metrics after each dispatch instead. Both sides run JaxMARL's MPE configuration (ippo_ff_mpe.yaml:
16 envs x 128 steps, 4 epochs x 4 minibatches, lr 2.5e-4 annealed, 64 tanh units, shared parameters), scan the same
iterations per dispatch and fetch their metrics after each; repeats alternate (J F J F ...), so drift on a shared
machine hits both alike. Prints the median env steps/s of each and their ratio; writes JSON. With `--seeds N`,
N seeds at once: JaxMARL's `jax.vmap` of its training over seeds (its NUM_SEEDS) against a fragc population of N.
With `--no-trunc`, a third side: fragc's IPPO with JaxMARL's maths (`IPPONoTruncation`), so what fragc's truncation
bootstrapping costs is measured beside the gap to JaxMARL's script.

    python bench/jaxmarl_ippo.py [--repeats 7] [--iterations 8] [--seeds 1] [--no-trunc] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState

import fragc
from fragc.algos import ippo
from fragc.algos.marl_envs import make_marl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ppo_single import PPONoTruncation  # noqa: E402


class IPPONoTruncation(ippo.IPPO):
    """fragc's IPPO with JaxMARL's maths (`--no-trunc`): every done terminal, V(s_{t+1}) the next step's value, so
    the rollout's critic pass over the reached observations is gone (bench/ppo_single.py's `PPONoTruncation` with the
    agent axes). MPE's episodes all end at its time limit, which fragc's IPPO bootstraps and JaxMARL's does not. A
    bench side, not an algorithm; shared parameters only."""

    rollout_no_trunc = fragc.fragment(role="actor", in_axes=(None, 0), out_axes=(1, 0, None),
                                      agent_axes=ippo.IPPO.rollout_shared.agent_axes)(PPONoTruncation.rollout.fn)

    def __init__(self, config: ippo.Config = ippo.Config()):
        super().__init__(config)
        self.rollout = self.rollout_no_trunc


class ActorCritic(nn.Module):
    action_dim: int

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        orth, zeros = nn.initializers.orthogonal, nn.initializers.constant(0.0)
        actor = nn.tanh(nn.Dense(64, kernel_init=orth(np.sqrt(2)), bias_init=zeros)(x))
        actor = nn.tanh(nn.Dense(64, kernel_init=orth(np.sqrt(2)), bias_init=zeros)(actor))
        logits = nn.Dense(self.action_dim, kernel_init=orth(0.01), bias_init=zeros)(actor)
        critic = nn.tanh(nn.Dense(64, kernel_init=orth(np.sqrt(2)), bias_init=zeros)(x))
        critic = nn.tanh(nn.Dense(64, kernel_init=orth(np.sqrt(2)), bias_init=zeros)(critic))
        return logits, jnp.squeeze(nn.Dense(1, kernel_init=orth(1.0), bias_init=zeros)(critic), -1)


class Transition(NamedTuple):
    done: jax.Array
    action: jax.Array
    value: jax.Array
    reward: jax.Array
    log_prob: jax.Array
    obs: jax.Array
    info: dict


def make_train(config: dict) -> Any:
    """JaxMARL's shape: `init(rng)` the runner state, `update_step(runner_state, _)` one update for `lax.scan`."""
    from jaxmarl.wrappers.baselines import MPELogWrapper

    env = MPELogWrapper(make_marl(config["ENV_NAME"]))
    agents = env.agents
    num_actors = env.num_agents * config["NUM_ENVS"]
    batch_size = config["NUM_STEPS"] * num_actors  # every step of every actor, permuted each epoch
    updates = config["TOTAL_TIMESTEPS"] // config["NUM_STEPS"] // config["NUM_ENVS"]
    network = ActorCritic(env.action_space(agents[0]).n)

    def batchify(x: dict) -> jax.Array:
        return jnp.stack([x[a] for a in agents]).reshape((num_actors, -1))

    def unbatchify(x: jax.Array) -> dict:
        x = x.reshape((env.num_agents, config["NUM_ENVS"]))
        return {a: x[i] for i, a in enumerate(agents)}

    def schedule(count: jax.Array) -> jax.Array:
        frac = 1.0 - (count // (config["NUM_MINIBATCHES"] * config["UPDATE_EPOCHS"])) / updates
        return config["LR"] * frac

    def init(rng: jax.Array) -> tuple:
        rng, net_rng = jax.random.split(rng)
        params = network.init(net_rng, jnp.zeros(env.observation_space(agents[0]).shape))
        tx = optax.chain(optax.clip_by_global_norm(config["MAX_GRAD_NORM"]), optax.adam(schedule, eps=1e-5))
        rng, env_rng = jax.random.split(rng)
        obs, env_state = jax.vmap(env.reset)(jax.random.split(env_rng, config["NUM_ENVS"]))
        return TrainState.create(apply_fn=network.apply, params=params, tx=tx), env_state, obs, rng

    def update_step(runner_state: tuple, unused: Any) -> tuple:
        def env_step(state: tuple, unused: Any) -> tuple:
            train_state, env_state, last_obs, rng = state
            obs_batch = batchify(last_obs)
            rng, act_rng = jax.random.split(rng)
            logits, value = network.apply(train_state.params, obs_batch)
            action = jax.random.categorical(act_rng, logits)
            log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], -1)[:, 0]
            rng, step_rng = jax.random.split(rng)
            obsv, env_state, reward, done, info = jax.vmap(env.step)(
                jax.random.split(step_rng, config["NUM_ENVS"]), env_state, unbatchify(action))
            info = jax.tree.map(lambda x: x.reshape((num_actors,)), info)
            transition = Transition(batchify(done).squeeze(-1), action, value, batchify(reward).squeeze(-1),
                                    log_prob, obs_batch, info)
            return (train_state, env_state, obsv, rng), transition

        runner_state, traj = jax.lax.scan(env_step, runner_state, None, config["NUM_STEPS"])
        train_state, env_state, last_obs, rng = runner_state
        _, last_val = network.apply(train_state.params, batchify(last_obs))

        def gae_step(carry: tuple, t: Transition) -> tuple:
            gae, next_value = carry
            delta = t.reward + config["GAMMA"] * next_value * (1 - t.done) - t.value
            gae = delta + config["GAMMA"] * config["GAE_LAMBDA"] * (1 - t.done) * gae
            return (gae, t.value), gae

        _, advantages = jax.lax.scan(gae_step, (jnp.zeros_like(last_val), last_val), traj, reverse=True, unroll=8)
        targets = advantages + traj.value

        def update_epoch(state: tuple, unused: Any) -> tuple:
            def update_minibatch(train_state: TrainState, batch: tuple) -> tuple:
                t, gae, target = batch

                def loss_fn(params: Any) -> tuple:
                    logits, value = network.apply(params, t.obs)
                    log_probs = jax.nn.log_softmax(logits)
                    log_prob = jnp.take_along_axis(log_probs, t.action[..., None], -1)[..., 0]
                    clipped = t.value + (value - t.value).clip(-config["CLIP_EPS"], config["CLIP_EPS"])
                    value_loss = 0.5 * jnp.maximum((value - target) ** 2, (clipped - target) ** 2).mean()
                    ratio = jnp.exp(log_prob - t.log_prob)
                    norm = (gae - gae.mean()) / (gae.std() + 1e-8)
                    actor_loss = -jnp.minimum(ratio * norm, jnp.clip(ratio, 1 - config["CLIP_EPS"],
                                                                     1 + config["CLIP_EPS"]) * norm).mean()
                    entropy = -(jnp.exp(log_probs) * log_probs).sum(-1).mean()
                    total = actor_loss + config["VF_COEF"] * value_loss - config["ENT_COEF"] * entropy
                    return total, (value_loss, actor_loss, entropy, ratio)

                (total, (value_loss, actor_loss, entropy, ratio)), grads = jax.value_and_grad(
                    loss_fn, has_aux=True)(train_state.params)
                return train_state.apply_gradients(grads=grads), {
                    "total_loss": total, "actor_loss": actor_loss, "critic_loss": value_loss, "entropy": entropy,
                    "ratio": ratio}

            train_state, rng = state
            rng, perm_rng = jax.random.split(rng)
            perm = jax.random.permutation(perm_rng, batch_size)
            batch = jax.tree.map(lambda x: x.reshape((batch_size,) + x.shape[2:]), (traj, advantages, targets))
            shuffled = jax.tree.map(lambda x: jnp.take(x, perm, axis=0), batch)
            minibatches = jax.tree.map(lambda x: x.reshape((config["NUM_MINIBATCHES"], -1) + x.shape[1:]), shuffled)
            train_state, loss_info = jax.lax.scan(update_minibatch, train_state, minibatches)
            return (train_state, rng), loss_info

        (train_state, rng), loss_info = jax.lax.scan(update_epoch, (train_state, rng), None, config["UPDATE_EPOCHS"])
        r0 = {"ratio0": loss_info["ratio"][0, 0].mean()}
        metric = {**jax.tree.map(jnp.mean, traj.info), **jax.tree.map(jnp.mean, loss_info), **r0}
        return (train_state, env_state, last_obs, rng), metric

    return init, update_step


def jaxmarl_config(c: ippo.Config) -> dict:
    return {"ENV_NAME": c.env.partition(":")[2], "NUM_ENVS": c.num_envs, "NUM_STEPS": c.num_steps,
            "TOTAL_TIMESTEPS": c.total_steps, "UPDATE_EPOCHS": c.update_epochs, "NUM_MINIBATCHES": c.num_minibatches,
            "LR": c.lr, "GAMMA": c.gamma, "GAE_LAMBDA": c.gae_lambda, "CLIP_EPS": c.clip_eps, "ENT_COEF": c.ent_coef,
            "VF_COEF": c.vf_coef, "MAX_GRAD_NORM": c.max_grad_norm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--iterations", type=int, default=8, help="iterations per timed dispatch")
    parser.add_argument("--seeds", type=int, default=1,
                        help="N > 1: N seeds at once, JaxMARL's `vmap` over seeds against a fragc population")
    parser.add_argument("--no-trunc", action="store_true",
                        help="a third side: fragc's IPPO with JaxMARL's maths (IPPONoTruncation), both sides' maths alike")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    config = ippo.Config()  # JaxMARL's ippo_ff_mpe.yaml
    k = args.iterations
    steps = k * config.num_envs * config.num_steps

    n = args.seeds
    steps *= n
    init, update_step = make_train(jaxmarl_config(config))
    policy = "single" if n == 1 else fragc.population("single", n)
    if n == 1:
        scanned = jax.jit(lambda s: jax.lax.scan(update_step, s, None, k), donate_argnums=0)
        jm_state = jax.jit(init)(jax.random.key(0))
    else:  # JaxMARL's NUM_SEEDS: `jax.vmap` of the training over seeds; the members' init mapped (`lax.map`), as
        # bench/population.py maps PureJaxRL's (a vmapped orthogonal init deadlocked XLA's CPU pool there)
        scanned = jax.jit(jax.vmap(lambda s: jax.lax.scan(update_step, s, None, k)), donate_argnums=0)
        jm_state = jax.jit(lambda keys: jax.lax.map(init, keys))(jax.random.split(jax.random.key(0), n))

    def run_jaxmarl() -> None:
        nonlocal jm_state
        jm_state, metrics = scanned(jm_state)
        jax.device_get(metrics)

    def fragc_side(algo: ippo.IPPO):
        prog = fragc.compile(algo, policy, iterations_per_dispatch=k)
        state = prog.init(0)

        def run() -> None:
            nonlocal state
            state, history = prog.run(state, k)
            jax.device_get(history["loss"])
        return run

    sides = {"jaxmarl": run_jaxmarl, "fragc": fragc_side(ippo.IPPO(config))}
    if args.no_trunc:
        sides["fragc_no_trunc"] = fragc_side(IPPONoTruncation(config))
    for run in sides.values():  # compile and warm up
        run()
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, run in sides.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    rates = {name: steps / statistics.median(t) for name, t in times.items()}
    ratio = rates["fragc"] / rates["jaxmarl"]
    for name, rate in rates.items():
        print(f"{name:14s} {rate:12,.0f} env steps/s (median of {args.repeats}; {k} iterations of "
              f"{config.num_envs}x{config.num_steps} a repeat" + (f", {n} seeds at once)" if n > 1 else ")"))
    ratios = {}
    for name in [s for s in sides if s != "jaxmarl"]:
        per_repeat = [j / f for f, j in zip(times[name], times["jaxmarl"])]
        ratios[name] = statistics.median(per_repeat)
        print(f"{name} / jaxmarl: {rates[name] / rates['jaxmarl']:.2f}x (ratio of medians); per-repeat median "
              f"{ratios[name]:.2f}, ratios {[round(r, 2) for r in per_repeat]}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "jaxmarl_ippo.json" if n == 1 else f"jaxmarl_ippo_{n}_seeds.json")
    with open(path, "w") as f:
        json.dump({"backend": jax.default_backend(), "iterations": k, "repeats": args.repeats, "seeds": n, "seconds": times,
                   "env_steps_per_s": rates, "ratio": ratio, "per_repeat_ratio_medians": ratios}, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
