"""What fragc's PPO computes beyond PureJaxRL's `ppo.py`, each measured on and off, beside the reference itself.

fragc's built-in PPO does three things PureJaxRL's does not:
- **per-environment keys**: each environment carries its own key and splits it three ways a step (acting, its
  step, the carry), where PureJaxRL splits one key for all environments. They keep replicas' streams apart under
  every policy, so they stay; this measures their price. Off: PureJaxRL's draws (one key split for all the
  environments' actions, one split into N for their steps).
- **truncation bootstrap**: V(s_{t+1}) of the state each step reached, before any reset, in one batched call after
  the rollout, so that a truncated episode bootstraps. Off: PureJaxRL's `next_value` (the next step's value, the last
  observation's at the end) and `done` as termination.
- **diagnostics**: approx_kl, clip_fraction, explained_variance and the learning rate, from what the loss already
  computes (src/fragc/algos/diagnostics.py). Off: those metrics dropped inside the fragments, so XLA removes their work.

Each variant is fragc's PPO with one thing changed (a subclass here, never shipped), compiled under "single" as the
built-in one is, all timed alternately in one process (side_by_side.steady) with PureJaxRL's own `ppo.py` (built by
`python bench/references/build.py`) at its configuration. Ratios: the side's time / fragc's (above 1: the side is
slower than fragc as shipped).

    python bench/ppo_extras.py --repeats 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ppo_reference  # noqa: E402
import references_built as references  # noqa: E402
import side_by_side  # noqa: E402

from fragc.runtime import cpu_lowering  # noqa: E402,F401  (before any jit: its jit-cache state)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import fragc  # noqa: E402
from fragc.algos import ppo  # noqa: E402
from fragc.algos.actor_critic import count_episodes, log_prob_of  # noqa: E402
from fragc.algos.diagnostics import episode_metrics  # noqa: E402

DIAGNOSTICS = ("approx_kl", "clip_fraction", "explained_variance", "learning_rate")
VARIANTS = {  # side -> (per-environment keys, truncation bootstrap, diagnostics)
    "fragc": (True, True, True),
    "shared_keys": (False, True, True),
    "no_bootstrap": (True, False, True),
    "no_diagnostics": (True, True, False),
    "all_off": (False, False, False),
}


class Variant(ppo.PPO):
    """fragc's PPO with each of its extras on or off."""

    def __init__(self, config: ppo.Config, per_env_keys: bool, bootstrap: bool, diagnostics: bool):
        super().__init__(config)
        self.per_env_keys, self.bootstrap, self.diagnostics = per_env_keys, bootstrap, diagnostics

    def _draws(self, runner: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(acting keys or key, step keys [N], the runner's carried keys)."""
        if self.per_env_keys:
            keys = jax.vmap(lambda k: jax.random.split(k, 3))(runner.key)
            return keys[:, 0], keys[:, 1], keys[:, 2]
        key, act_key, step_key = jax.random.split(runner.key[0], 3)
        carried = jnp.broadcast_to(key, runner.key.shape)
        return act_key, jax.random.split(step_key, runner.key.shape[0]), carried

    def _act(self, params: Any, obs: jax.Array, act_keys: jax.Array) -> tuple:
        if self.per_env_keys:
            return self.model.act(params, obs, act_keys)
        logits, value = self.model.apply(params, obs)
        action = jax.random.categorical(act_keys, logits)
        return action, log_prob_of(jax.nn.log_softmax(logits), action), value

    @fragc.fragment(role="actor", in_axes=(None, 0), out_axes=(1, 0, None))
    def rollout(self, params: Any, runner: Any) -> tuple:
        def step(runner: Any, _: None) -> tuple:
            act_keys, step_keys, carried = self._draws(runner)
            obs = runner.obs
            action, log_prob, value = self._act(params, obs, act_keys)
            runner, out = self.env.step(runner.replace(key=carried), action, step_keys)
            reached = out.final_obs if self.bootstrap else None
            return runner, (obs, action, log_prob, value, reached, out.reward, out.terminated, out.episode_done)

        runner, (obs, action, log_prob, value, reached, reward, terminated, done) = jax.lax.scan(
            step, runner, None, self.config.num_steps)
        if self.bootstrap:
            next_value = self.model.value(params, reached)
        else:  # PureJaxRL's: the next step's value (after a reset where done), the last observation's at the end
            next_value = jnp.concatenate([value[1:], self.model.value(params, runner.obs)[None]])
            terminated = done
        traj = ppo.Transition(obs, action, log_prob, value, None, next_value, reward, terminated, done)
        metrics = {**episode_metrics(runner), "episodes": count_episodes(done)}
        return traj, runner, metrics

    @fragc.fragment(role="learner", in_axes=(None, 1), out_axes=(None, None))
    def learn(self, learner: Any, traj: Any) -> tuple:
        learner, metrics = ppo.update(learner, traj, self.config, self.model, self.optimizer)
        if not self.diagnostics:
            metrics = {k: v for k, v in metrics.items() if k not in DIAGNOSTICS}
        return learner, metrics


def make_side(side: str) -> side_by_side.Side:
    if side == "purejaxrl":
        return ppo_reference.make_side("purejaxrl")
    config = ppo_reference.fragc_config(ppo_reference.CONFIG)
    algo = ppo.PPO(config) if side == "fragc" else Variant(config, *VARIANTS[side])
    return side_by_side.fragc_side(lambda: fragc.compile(algo, "single"), ppo_reference.ITERATIONS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    revision = references.require("purejaxrl")
    sides = ("purejaxrl", *VARIANTS)
    raw = side_by_side.steady({side: make_side(side) for side in sides}, args.repeats)
    processor = references.processor()
    print(f"\nfragc's PPO with its extras on and off, against PureJaxRL ppo.py @ {revision['commit'][:12]}, {processor}, "
          f"load {min(raw['loads']):.1f}-{max(raw['loads']):.1f}; ratio = side / fragc as shipped, per round, median")
    result = {"processor": processor, "reference": revision, "raw": raw, "ratios": {}}
    for measure in ("wall_s", "cpu_s"):
        times = raw[measure]
        for side in sides:
            rounds = [s / f for s, f in zip(times[side], times["fragc"])]
            result["ratios"].setdefault(measure, {})[side] = statistics.median(rounds)
            print(f"  {measure:7} {side:15} {statistics.median(times[side]):6.2f} s   ratio {statistics.median(rounds):.3f}"
                  f" (rounds {min(rounds):.3f}-{max(rounds):.3f})")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ppo_extras.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
