"""GPU experiment (2026-11-26): which formulation of fragc's SAC learner closes the gap to the CleanRL side?
Sides (alternating, medians), all fragc `single` (static trip count built in) except cleanrl:
  fragc      d404db6's SAC (unroll=1): `sample` draws all G batches, `learn` scans over them (5 dynamic slices a step)
  packed     the same numbers: learn concatenates the batches' leaves into one [G, B, F] array, one slice a step
  unrolled   the same numbers: learn's scan unrolled (static slices)
  inloop     each gradient step samples its own batch inside the loop (sample + update under lax.scan)
  cleanrl    bench/sac_plain.py's independent side

    python bench/experiments/sac_variants_gpu.py [--k 16] [--iterations 64] [--repeats 9]
"""
import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import sac_plain  # noqa: E402

import fragc  # noqa: E402
from fragc.algos import sac  # noqa: E402
from fragc.algos.replay import Transition  # noqa: E402

NONE = {"qf_loss": 0.0, "actor_loss": 0.0, "alpha_loss": 0.0, "entropy": 0.0}


def pack(b):
    return jnp.concatenate([b.obs, b.action, b.reward[..., None], b.next_obs,
                            b.terminated[..., None].astype(jnp.float32)], -1)


def unpack(p, o, a):
    return Transition(p[..., :o], p[..., o:o + a], p[..., o + a], p[..., o + a + 1:2 * o + a + 1], p[..., -1])


class PackedSAC(sac.SAC):
    @fragc.fragment(role="learner", in_axes=(None, 1), out_axes=(None, None))
    def learn(self, learner, batches):
        c = self.config
        o, a = batches.obs.shape[-1], batches.action.shape[-1]
        env_steps = learner.env_steps + c.steps_per_iteration
        learner, metrics = jax.lax.cond(
            env_steps > c.learning_starts,
            lambda l: jax.lax.scan(lambda l, p: self.update(l, unpack(p, o, a)), l, pack(batches)),
            lambda l: (l, jax.tree.map(lambda x: jnp.zeros(c.gradient_steps), NONE)), learner)
        metrics = fragc.pmean(jax.tree.map(jnp.mean, metrics))
        return learner.replace(env_steps=env_steps), {**metrics, "alpha": self.alpha(learner.log_alpha)}


class UnrolledSAC(sac.SAC):
    @fragc.fragment(role="learner", in_axes=(None, 1), out_axes=(None, None))
    def learn(self, learner, batches):
        c = self.config
        env_steps = learner.env_steps + c.steps_per_iteration
        learner, metrics = jax.lax.cond(
            env_steps > c.learning_starts,
            lambda l: jax.lax.scan(self.update, l, batches, unroll=True),
            lambda l: (l, jax.tree.map(lambda x: jnp.zeros(c.gradient_steps), NONE)), learner)
        metrics = fragc.pmean(jax.tree.map(jnp.mean, metrics))
        return learner.replace(env_steps=env_steps), {**metrics, "alpha": self.alpha(learner.log_alpha)}


class InLoopSAC(sac.SAC):
    @property
    def batches_per_iteration(self):
        return 1

    @fragc.fragment(role="learner", in_axes=(None, 1), out_axes=(None, None))
    def learn_one(self, learner, batch):
        learner, m = self.update(learner, jax.tree.map(lambda x: x[0], batch))
        return learner, fragc.pmean(m)

    def iteration(self, state):
        c = self.config
        traj, runner, metrics = self.rollout(state.learner.actor, state.learner.env_steps, state.runner)
        buffer = self.insert(state.buffer, traj)
        key, k = jax.random.split(state.learner.key)
        env_steps = state.learner.env_steps + c.steps_per_iteration

        def step(learner, key):
            return self.learn_one(learner, self.sample(buffer, key))

        learner, losses = jax.lax.cond(
            env_steps > c.learning_starts,
            lambda l: jax.lax.scan(step, l, jax.random.split(k, c.gradient_steps)),
            lambda l: (l, jax.tree.map(lambda x: jnp.zeros(c.gradient_steps), NONE)), state.learner.replace(key=key))
        losses = jax.tree.map(jnp.mean, losses)
        learner = learner.replace(env_steps=env_steps)
        state = state.replace(learner=learner, runner=runner, buffer=buffer)
        return state, {**metrics, **losses, "alpha": self.alpha(learner.log_alpha)}


def fragc_side(algo, K, IT):
    t = time.perf_counter()
    prog = fragc.compile(algo, "single", iterations_per_dispatch=K)
    s = jax.block_until_ready(prog.init(0))
    print(f"compiled {type(algo).__name__} in {time.perf_counter() - t:.1f} s", flush=True)
    return prog, s, (lambda s: prog.run(s, IT)[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=16, help="iterations per dispatch")
    parser.add_argument("--iterations", type=int, default=64, help="iterations timed per repeat")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    K, IT, REPEATS = args.k, args.iterations, args.repeats
    config = sac.Config(learning_starts=0, unroll=1)  # the rolled loop of d404db6, before Config.unroll
    progs = {}
    sides = {}
    for name, cls in (("fragc", sac.SAC), ("packed", PackedSAC), ("unrolled", UnrolledSAC), ("inloop", InLoopSAC)):
        progs[name], s, run = fragc_side(cls(config), K, IT)
        sides[name] = (s, run)
    train = sac_plain.make_train(config)
    ps = jax.jit(train.init)(jax.random.key(0))
    static = jax.jit(lambda s: jax.lax.scan(train.update_step, s, None, K), donate_argnums=0).lower(ps).compile()
    sides["cleanrl"] = (ps, sac_plain.dispatched(static, IT, K))
    # same numbers? (packed and unrolled must be HEAD's SAC to rounding)
    ref = progs["fragc"].run(sides["fragc"][0], 4)[0]
    for name in ("packed", "unrolled"):
        got = progs[name].run(sides[name][0], 4)[0]
        d = max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(ref), jax.tree.leaves(got))
                if jnp.issubdtype(x.dtype, jnp.floating))
        print(f"{name}: max |state - HEAD's| after 4 iterations = {d:.3g}", flush=True)
    states = {n: jax.block_until_ready(run(s)) for n, (s, run) in sides.items()}
    times = {n: [] for n in sides}
    for _ in range(REPEATS):
        for n, (_, run) in sides.items():
            t = time.perf_counter()
            jax.block_until_ready(run(states[n]))
            times[n].append(time.perf_counter() - t)
    base = times["cleanrl"]
    print(f"device {jax.devices()[0].device_kind}, jax {jax.__version__}, {REPEATS} alternating repeats of {IT} "
          f"iterations")
    for n, ts in times.items():
        sps = [IT * config.steps_per_iteration / t for t in ts]
        r = [b / t for b, t in zip(base, ts)]
        print(f"{n:10} {statistics.median(sps):10.0f} env-steps/s   / cleanrl: median {statistics.median(r):.3f} "
              f"(min {min(r):.3f}, max {max(r):.3f})", flush=True)


if __name__ == "__main__":
    main()
