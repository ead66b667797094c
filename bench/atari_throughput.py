"""PPO on EnvPool's Breakout-v5 with CleanRL's Atari values: fragc against a plain JAX + EnvPool PPO written the
CleanRL way, env-steps/s of training (rollout and learning), alternating in one run.

    python bench/atari_throughput.py [--env Breakout-v5] [--iterations 3] [--repeats 3] [--out bench/results]

Sides, each timed over `--iterations` iterations of 8 environments x 128 steps, 4 epochs x 4 minibatches, after
one untimed iteration (compiling):

- `plain`: this file's own PPO, independent of fragc's algorithms, as CleanRL's `ppo_atari_envpool_xla_jax.py`
  is written: a Python loop over the steps (a jitted policy step, EnvPool's `step` on the host), CleanRL's Nature
  CNN, GAE by `lax.scan`, a Python loop over epochs and minibatches around a jitted minibatch update;
- `fragc single`: `fragc.compile(ppo, "single")`, the host loop with one environment group (inference and
  stepping alternate);
- `fragc single G=2`: the same with the environments in two groups, one's inference overlapping the other's
  stepping;
- `fragc actor_learner_async G=2`: the rollout on one device and learning on another (simulated CPU devices here:
  they share the machine's cores), pipelined, two environment groups.

Prints each side's median env-steps/s and its ratio to `plain` (median of the per-round ratios, min-max), and
writes atari_throughput.json, with where the plain side's time goes (`plain_split`: inference, the policy step
with the frames crossing to the device and the action back; env, EnvPool's step; learning, GAE and the updates).
Needs `pip install -e '.[atari]'`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

CLEANRL = {"num_envs": 8, "num_steps": 128, "update_epochs": 4, "num_minibatches": 4, "lr": 2.5e-4,
           "gamma": 0.99, "gae_lambda": 0.95, "clip_eps": 0.1, "ent_coef": 0.01, "vf_coef": 0.5,
           "max_grad_norm": 0.5, "total_steps": 10_000_000}
"""CleanRL's ppo_atari_envpool.py values (learning rate annealed over 1e7 steps)."""


# ---------------------------------------------------------------- the plain side, CleanRL's way


def plain_ppo(env_id: str, seed: int = 0):
    """(run(iterations) -> env steps made, close): CleanRL's Atari PPO in plain JAX on an EnvPool pool."""
    import envpool
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax
    from flax.training.train_state import TrainState

    c = CLEANRL
    envs = envpool.make_gymnasium(env_id, num_envs=c["num_envs"], episodic_life=True, reward_clip=True, seed=seed,
                                  repeat_action_probability=0.0, full_action_space=False, noop_max=30)
    num_actions = envs.action_space.n
    ortho, zeros = nn.initializers.orthogonal, nn.initializers.constant(0.0)

    class Network(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = jnp.transpose(x, (0, 2, 3, 1)) / 255.0
            for features, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
                x = nn.relu(nn.Conv(features, (kernel, kernel), (stride, stride), padding="VALID",
                                    kernel_init=ortho(np.sqrt(2)), bias_init=zeros)(x))
            x = x.reshape((x.shape[0], -1))
            return nn.relu(nn.Dense(512, kernel_init=ortho(np.sqrt(2)), bias_init=zeros)(x))

    network = Network()
    actor = nn.Dense(num_actions, kernel_init=ortho(0.01), bias_init=zeros)
    critic = nn.Dense(1, kernel_init=ortho(1.0), bias_init=zeros)
    key = jax.random.key(seed)
    key, k1, k2, k3 = jax.random.split(key, 4)
    obs, _ = envs.reset()
    hidden = network.init(k1, obs)
    params = {"network": hidden, "actor": actor.init(k2, network.apply(hidden, obs)),
              "critic": critic.init(k3, network.apply(hidden, obs))}
    batch = c["num_envs"] * c["num_steps"]
    minibatch = batch // c["num_minibatches"]
    updates = c["total_steps"] // batch
    schedule = lambda count: c["lr"] * (1.0 - (count // (c["num_minibatches"] * c["update_epochs"])) / updates)  # noqa: E731
    tx = optax.chain(optax.clip_by_global_norm(c["max_grad_norm"]),
                     optax.inject_hyperparams(optax.adam)(learning_rate=schedule, eps=1e-5))
    state = TrainState.create(apply_fn=None, params=params, tx=tx)

    @jax.jit
    def get_action_and_value(params, obs, key):
        hidden = network.apply(params["network"], obs)
        logits = actor.apply(params["actor"], hidden)
        key, subkey = jax.random.split(key)
        u = jax.random.uniform(subkey, shape=logits.shape)
        action = jnp.argmax(logits - jnp.log(-jnp.log(u)), axis=1)
        logprob = jax.nn.log_softmax(logits)[jnp.arange(action.shape[0]), action]
        value = critic.apply(params["critic"], hidden)
        return action, logprob, value.squeeze(1), key

    def evaluate(params, obs, action):
        hidden = network.apply(params["network"], obs)
        logits = actor.apply(params["actor"], hidden)
        logprob = jax.nn.log_softmax(logits)[jnp.arange(action.shape[0]), action]
        p = jax.nn.softmax(logits)
        entropy = -jnp.sum(p * jax.nn.log_softmax(logits), axis=1)
        return logprob, entropy, critic.apply(params["critic"], hidden).squeeze(1)

    @jax.jit
    def compute_gae(params, next_obs, next_done, rewards, dones, values):
        next_value = critic.apply(params["critic"], network.apply(params["network"], next_obs)).squeeze(1)

        def step(carry, x):
            lastgaelam, nextnonterminal, nextvalues = carry
            reward, done, value = x
            delta = reward + c["gamma"] * nextvalues * nextnonterminal - value
            lastgaelam = delta + c["gamma"] * c["gae_lambda"] * nextnonterminal * lastgaelam
            return (lastgaelam, 1.0 - done, value), lastgaelam

        init = (jnp.zeros_like(next_value), 1.0 - next_done, next_value)
        _, advantages = jax.lax.scan(step, init, (rewards, dones, values), reverse=True)
        return advantages, advantages + values

    @jax.jit
    def update_minibatch(state, obs, actions, logprobs, advantages, returns, values):
        def loss(params):
            newlogprob, entropy, newvalue = evaluate(params, obs, actions)
            logratio = newlogprob - logprobs
            ratio = jnp.exp(logratio)
            adv = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
            pg = jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1 - c["clip_eps"], 1 + c["clip_eps"])).mean()
            v_clipped = values + jnp.clip(newvalue - values, -c["clip_eps"], c["clip_eps"])
            v = 0.5 * jnp.maximum((newvalue - returns) ** 2, (v_clipped - returns) ** 2).mean()
            return pg - c["ent_coef"] * entropy.mean() + v * c["vf_coef"]

        grads = jax.grad(loss)(state.params)
        return state.apply_gradients(grads=grads)

    carried = {"state": state, "obs": obs, "done": np.zeros(c["num_envs"], np.float32), "key": key}
    split = {"inference": 0.0, "env": 0.0, "learning": 0.0}  # seconds, over every iteration run

    def run(iterations: int) -> int:
        state, obs, done, key = carried["state"], carried["obs"], carried["done"], carried["key"]
        for _ in range(iterations):
            rows = []
            for _ in range(c["num_steps"]):
                t0 = time.perf_counter()
                action, logprob, value, key = get_action_and_value(state.params, obs, key)
                action_np = np.asarray(action)  # waits for the policy step (obs crossed to the device in its call)
                t1 = time.perf_counter()
                next_obs, reward, terminated, truncated, _ = envs.step(action_np)
                split["inference"] += t1 - t0
                split["env"] += time.perf_counter() - t1
                rows.append((obs, action, logprob, value, reward, done))
                obs, done = next_obs, (terminated | truncated).astype(np.float32)
            t0 = time.perf_counter()
            b_obs, b_actions, b_logprobs, b_values = (jnp.stack(col) for col in list(zip(*rows))[:4])
            rewards, dones = (jnp.asarray(np.stack(col)) for col in list(zip(*rows))[4:])
            advantages, returns = compute_gae(state.params, obs, done, rewards, dones, b_values)
            flat = [x.reshape((batch,) + x.shape[2:]) for x in (b_obs, b_actions, b_logprobs, advantages, returns,
                                                                  b_values)]
            for _ in range(c["update_epochs"]):
                key, subkey = jax.random.split(key)
                perm = jax.random.permutation(subkey, batch)
                for start in range(0, batch, minibatch):
                    idx = perm[start:start + minibatch]
                    state = update_minibatch(state, *(x[idx] for x in flat))
            jax.block_until_ready(state.params)
            split["learning"] += time.perf_counter() - t0
        carried.update(state=state, obs=obs, done=done, key=key)
        return iterations * batch

    run.split = split
    return run, envs.close


# ---------------------------------------------------------------- fragc's side


def fragc_ppo(env_id: str, policy: str, devices: int, groups: int, seed: int = 0):
    """(run(iterations) -> env steps made, close): fragc's built-in PPO with the same values."""
    import jax

    import fragc
    from fragc import algos

    algo = algos.make("ppo", env=f"envpool:{env_id}", network="nature_cnn", **CLEANRL)
    prog = fragc.compile(algo, policy, devices=devices, env_groups=groups, iterations_per_dispatch=1)
    carried = {"state": prog.init(seed)}

    def run(iterations: int) -> int:
        state, _ = prog.run(carried["state"], iterations)
        jax.block_until_ready(state)
        carried["state"] = state
        return iterations * algo.steps_per_iteration

    return run, lambda: None


SIDES = {"plain": None, "fragc single": ("single", 1, 1), "fragc single G=2": ("single", 1, 2),
         "fragc actor_learner_async G=2": ("actor_learner_async", 2, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="Breakout-v5")
    parser.add_argument("--iterations", type=int, default=3, help="timed iterations per side and round")
    parser.add_argument("--repeats", type=int, default=3, help="rounds, each side once per round, alternating")
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    from fragc.devices import simulate_cpu_devices

    simulate_cpu_devices(2)  # actor_learner_async's two devices (before JAX's backend starts)
    sides = [s.strip() for s in args.sides.split(",")]
    runners = {}
    for side in sides:
        start = time.perf_counter()
        runners[side] = plain_ppo(args.env) if SIDES[side] is None else fragc_ppo(args.env, *SIDES[side])
        runners[side][0](1)  # compiles (and, for fragc, the first dispatch)
        print(f"{side:32} ready in {time.perf_counter() - start:.1f} s", flush=True)
    rates: dict[str, list[float]] = {side: [] for side in sides}
    for r in range(args.repeats):
        for side in sides:
            start = time.perf_counter()
            steps = runners[side][0](args.iterations)
            rates[side].append(steps / (time.perf_counter() - start))
        print(f"round {r + 1}: " + ", ".join(f"{s} {rates[s][-1]:.0f}" for s in sides), flush=True)
    report = {"env": args.env, "iterations": args.iterations, "repeats": args.repeats, "cpus": os.cpu_count(),
              "sides": {}}
    for side in sides:
        row = {"env_steps_per_s": round(statistics.median(rates[side]), 1), "all": [round(x, 1) for x in rates[side]]}
        if "plain" in rates and side != "plain":
            ratios = [a / b for a, b in zip(rates[side], rates["plain"])]
            row["ratio_to_plain"] = [round(statistics.median(ratios), 3), round(min(ratios), 3), round(max(ratios), 3)]
        report["sides"][side] = row
        ratio = row.get("ratio_to_plain")
        print(f"{side:32} {row['env_steps_per_s']:8.1f} env-steps/s"
              + (f"   x{ratio[0]:.2f} ({ratio[1]:.2f}-{ratio[2]:.2f}) of plain" if ratio else ""), flush=True)
    if "plain" in runners:  # where an iteration's time goes (the plain side's phases, every iteration it ran)
        split = runners["plain"][0].split
        total = sum(split.values())
        report["plain_split"] = {k: round(v / total, 3) for k, v in split.items()}
        print("plain side's time: " + ", ".join(f"{k} {v / total:.0%}" for k, v in split.items()), flush=True)
    for _, close in runners.values():
        close()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "atari_throughput.json"), "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
