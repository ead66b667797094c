"""Full-length learning runs of every algorithm over several seeds, for docs/results.md.

    python bench/results.py [--seeds 0-9] [--only ppo,a2c] [--out bench/results] [--steps N]
    python bench/results.py --seeds 0 --only ppo_breakout_minatar,ppo_spaceinvaders_minatar,...
    python bench/results.py --only mappo_smax_3m --seeds 0-9 --vectorised --out DIR   # on a GPU
    python bench/results.py --only mappo_smax_3m --out DIR --from-curves              # summarise DIR's saved runs

Needs rliable (`pip install -e '.[sweep]'`, in the test extra). Per run: the final return (mean over environments
of each one's last completed episode, at the end of training). Per algorithm: every seed's final return, how many
reach the algorithm's threshold, the interquartile mean (IQM) over seeds and its 95% stratified-bootstrap
confidence interval (2,000 replications, seed 0), computed by `fragc.sinks.stats` with rliable (Agarwal et al. 2021);
before rliable this file had its own percentile bootstrap of the same statistic (docs/results.md says which rows
were computed with which). A row whose config sets `eval_every` reports the same of each seed's last greedy
evaluation (`eval_return`, src/fragc/algos/evaluation.py) on a line of its own, and under "greedy_eval" in its JSON. Each
run also writes OUT/NAME.png: the learning curves (IQM over seeds at each iteration, 95% bands).

Each row's configuration, step budget and threshold come from a named public reference (the comments beside RUNS;
docs/results.md cites them with the references' numbers), fixed before the ten-seed runs. The MinAtar rows (PPO
with PureJaxRL's MinAtar configuration, PQN with purejaxql's, 1e7 steps each) are a bench with no threshold, run
only when named with `--only`.

Algorithms whose policy is `single` run all seeds at once as one `population(single, seeds)` program (member i
starts from seed i, the same run as `--seed i` alone); the others run seed by seed. Each row's curves are saved
(OUT/NAME_curves.npz, OUT/NAME_run.json) before they are summarised, so runs made where rliable does not import (a
GPU machine's image) are summarised elsewhere with `--from-curves`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time

import numpy as np

PUREJAXRL_PPO_RNN = {  # PureJaxRL's ppo_rnn.py (its __main__ config: 4 envs x 128 steps, 4 epochs x 4 minibatches of
    "num_envs": 4, "num_steps": 64, "num_minibatches": 2,  # one environment's sequence, lr 2.5e-4 annealed, 5e5
    "total_steps": 500_000, "lr": 2.5e-4, "anneal_lr": True, "update_epochs": 4, "gamma": 0.99,  # steps), except
    "gae_lambda": 0.95, "clip_eps": 0.2, "ent_coef": 0.01, "vf_coef": 0.5, "max_grad_norm": 0.5,  # 64 x 2: fragc
}  # traces every fragment at 2 replicas, where 2 environments do not split into 4 minibatches; 4 x 64 in 2 keeps
# PureJaxRL's minibatch (128 transitions) and gradient steps per environment step (16 per 512), on 64-step sequences
ZOO_PPO_LSTM_NOVEL = {  # RL Baselines3 Zoo's RecurrentPPO on CartPoleNoVel-v1 (hyperparams/ppo_lstm.yml): 8 envs x 32
    "num_envs": 8, "num_steps": 32, "total_steps": 100_000, "lr": 1e-3, "update_epochs": 20,  # steps, batch 256
    "num_minibatches": 1, "gamma": 0.98, "gae_lambda": 0.8, "ent_coef": 0.0,  # (one minibatch), 20 epochs, 1e5 steps;
}  # its clip range is annealed from 0.2 (fragc's stays 0.2) and its policy an LSTM of 64 (fragc: GRU of 128)
ZOO_STEPS_PER_ITERATION = ZOO_PPO_LSTM_NOVEL["num_envs"] * ZOO_PPO_LSTM_NOVEL["num_steps"]
ZOO_ITERATIONS = ZOO_PPO_LSTM_NOVEL["total_steps"] // ZOO_STEPS_PER_ITERATION
"""390: the iterations of a zoo row (`Config.iterations`)."""
ZOO_5E5_EVAL = {"total_steps": 500_000, "eval_every": 500_000 // ZOO_STEPS_PER_ITERATION - 1, "eval_episodes": 32}
"""PureJaxRL's ppo_rnn.py budget on the zoo's rollouts (1,953 iterations), evaluated greedily at the last one."""
ZOO_CRITIC_GRU = {"mask_velocity": True, **ZOO_PPO_LSTM_NOVEL, "normalize_obs": True, "clip_value": False,
                  "critic_gru": True}
RUNS = [  # (name, algorithm, policy, devices, threshold on the final return, config overrides)
    ("ppo", "ppo", "single", 1, 475.0, {}),
    ("a2c", "a2c", "single", 1, 400.0, {}),
    ("dqn", "dqn", "single", 1, 400.0, {}),
    ("impala", "impala", "actor_learner_async", 2, 400.0, {}),  # one actor device, one learner device
    ("ppo_continuous", "ppo_continuous", "single", 1, -200.0, {}),
    # purejaxql's pqn_cartpole.yaml (= pqn's defaults): 5e5 steps; 475 is CartPole-v1's reward threshold
    ("pqn", "pqn", "single", 1, 475.0, {}),
    # CartPole without velocities (positions only), PureJaxRL's ppo_rnn.py configuration and 5e5-step budget; the
    # feed-forward baseline is ppo with the same values on the same masked observation
    ("ppo_rnn_masked_cartpole", "ppo_rnn", "single", 1, 475.0, {"mask_velocity": True, **PUREJAXRL_PPO_RNN}),
    ("ppo_masked_cartpole", "ppo_masked_velocity", "single", 1, 475.0, dict(PUREJAXRL_PPO_RNN)),
    ("ppo_rnn_masked_cartpole_zoo", "ppo_rnn", "single", 1, 475.0, {"mask_velocity": True, **ZOO_PPO_LSTM_NOVEL}),
    # the zoo's `normalize: {norm_obs: True, norm_reward: False}` too (SB3's VecNormalize: running mean and variance);
    # then also without value clipping (RecurrentPPO's default clip_range_vf=None); then also with the critic's own
    # GRU (the zoo's enable_critic_lstm=True). Each configuration fixed before its ten-seed run
    ("ppo_rnn_masked_cartpole_zoo_norm", "ppo_rnn", "single", 1, 475.0,
     {"mask_velocity": True, **ZOO_PPO_LSTM_NOVEL, "normalize_obs": True}),
    ("ppo_rnn_masked_cartpole_zoo_norm_unclipped_vf", "ppo_rnn", "single", 1, 475.0,
     {"mask_velocity": True, **ZOO_PPO_LSTM_NOVEL, "normalize_obs": True, "clip_value": False}),
    ("ppo_rnn_masked_cartpole_zoo_norm_critic_gru", "ppo_rnn", "single", 1, 475.0, ZOO_CRITIC_GRU),
    # the same runs (the evaluator has a key stream of its own), also evaluated as the zoo reports its agents: the
    # deterministic policy, observations normalized by the training statistics, frozen. At the first and the last
    # iteration (eval_every 389 of 390), 32 episodes
    ("ppo_rnn_masked_cartpole_zoo_norm_critic_gru_eval", "ppo_rnn", "single", 1, 475.0,
     {**ZOO_CRITIC_GRU, "eval_every": ZOO_ITERATIONS - 1, "eval_episodes": 32}),
    # the critic-GRU configuration with PureJaxRL's ppo_rnn.py budget (5e5 steps) in place of the zoo's 1e5: the
    # same values, its learning rate annealed over five times the updates. Screened on seeds 10-14, disjoint from the
    # ten (0-9), before a ten-seed run: 2/5 at 475 (docs/results.md), so not run on the ten
    ("ppo_rnn_masked_cartpole_zoo_norm_critic_gru_5e5", "ppo_rnn", "single", 1, 475.0,
     {**ZOO_CRITIC_GRU, "total_steps": 500_000}),
    # the configuration bench/rnn_screen.py's rule picked (fixed before its screen ran, ed48258): 16 environments in
    # 2 minibatches (the zoo's 256-transition minibatch) with the critic-GRU values and the zoo's 1e5-step budget;
    # screened on seeds 20-29 on an H200 (6/10 at 475 by the last dispatch's mean return, the best of 20 screened)
    ("ppo_rnn_masked_cartpole_zoo_critic_gru_envs16", "ppo_rnn", "single", 1, 475.0,
     {**ZOO_CRITIC_GRU, "num_envs": 16, "num_minibatches": 2}),
    # the pick of rnn_screen's fourth screen (fixed before it ran): 32 environments in 2 minibatches, 10 epochs, lr 5e-4,
    # gamma 0.98, PureJaxRL's 5e5 steps. 9/10 on seeds 20-29; its ten seeds ran in rnn_screen on an H200 (a vectorised
    # population, the last iteration's return: 6/10), not through this file (hours on this CPU)
    ("ppo_rnn_masked_cartpole_critic_gru_envs32_5e5", "ppo_rnn", "single", 1, 475.0,
     {**ZOO_CRITIC_GRU, "num_envs": 32, "num_minibatches": 2, "update_epochs": 10, "total_steps": 500_000,
      "lr": 5e-4}),
    # the zoo's policy itself (sb3-contrib's MlpLstmPolicy with the zoo's policy_kwargs for CartPoleNoVel-v1: an LSTM
    # of 64 fed the observation directly, the critic's own LSTM, heads of one 64-unit relu layer, PyTorch's default
    # init) with the critic-GRU row's values; its clip range stays 0.2 (the zoo anneals it). Fixed from the zoo's
    # model card before any ten-seed run, after two smoke runs of 2e4 steps on seeds 20-22
    ("ppo_rnn_masked_cartpole_zoo_sb3_lstm", "ppo_rnn", "single", 1, 475.0,
     {**ZOO_CRITIC_GRU, "lstm": True, "embed": False, "ortho_init": False, "hidden": 64}),
    # the same runs evaluated as the zoo reports its agents, as the critic-GRU row's `_eval` (added after the row
    # above gave 4/10 by the training return: both statistics are reported)
    ("ppo_rnn_masked_cartpole_zoo_sb3_lstm_eval", "ppo_rnn", "single", 1, 475.0,
     {**ZOO_CRITIC_GRU, "lstm": True, "embed": False, "ortho_init": False, "hidden": 64,
      "eval_every": ZOO_ITERATIONS - 1, "eval_episodes": 32}),
    # the zoo's recipe whole: the row above with its clip range annealed as the zoo's `lin_0.2` (anneal_clip), the
    # one value that row still left out; evaluated as above. Fixed before it ran, with no screen
    ("ppo_rnn_masked_cartpole_zoo_sb3_lstm_clip_eval", "ppo_rnn", "single", 1, 475.0,
     {**ZOO_CRITIC_GRU, "lstm": True, "embed": False, "ortho_init": False, "hidden": 64, "anneal_clip": True,
      "eval_every": ZOO_ITERATIONS - 1, "eval_episodes": 32}),
    # the zoo's policy (the `_sb3_lstm` rows: fixed clip 0.2) with PureJaxRL's ppo_rnn.py budget of 5e5 steps in place
    # of the zoo's 1e5 (1,953 iterations, the learning rate annealed over them), evaluated at the last iteration as
    # the `_eval` rows. Fixed before it ran (2026-11-26), with no screen
    ("ppo_rnn_masked_cartpole_zoo_sb3_lstm_5e5_eval", "ppo_rnn", "single", 1, 475.0,
     {**ZOO_CRITIC_GRU, "lstm": True, "embed": False, "ortho_init": False, "hidden": 64, **ZOO_5E5_EVAL}),
    # its feed-forward baseline on the same statistic: ppo (an MLP of 64, tanh) with the same values where ppo has
    # them (no observation normalization, no critic of its own), the velocities masked, evaluated greedily on the
    # masked observation at the last iteration. Fixed before it ran (2026-11-26), after the row above
    ("ppo_masked_cartpole_zoo_5e5_eval", "ppo_masked_velocity", "single", 1, 475.0,
     {**ZOO_PPO_LSTM_NOVEL, "clip_value": False, **ZOO_5E5_EVAL}),
    # CleanRL's sac_continuous_action.py hyperparameters (= sac's defaults), RL Baselines3 Zoo's Pendulum-v1 budget
    # (hyperparams/sac.yml: n_timesteps 20000); -200 as ppo_continuous' Pendulum threshold
    ("sac", "sac", "single", 1, -200.0, {}),
    # a bench, no threshold: CleanRL's 1e6 MuJoCo budget through the host loop (hours on this CPU)
    ("sac_halfcheetah", "sac", "single", 1, None, {"env": "gymnasium:HalfCheetah-v5", "total_steps": 1_000_000}),
]
MINATAR = {  # PureJaxRL's MinAtar PPO configuration (examples/brax_minatar.ipynb)
    "num_envs": 64, "num_steps": 128, "total_steps": 10_000_000, "lr": 5e-3, "update_epochs": 4,
    "num_minibatches": 8, "activation": "relu", "network": "mlp",  # the MLP on the flattened frames, as PureJaxRL's
}
PQN_MINATAR = {  # purejaxql's purejaxql/config/alg/pqn_minatar.yaml (no REW_SCALE: 1; pqn_gymnax.py's MLP: 2 x 128)
    "num_envs": 128, "num_steps": 32, "total_steps": 10_000_000, "lr": 5e-4, "lr_linear_decay": True,
    "num_epochs": 2, "num_minibatches": 32, "gamma": 0.99, "td_lambda": 0.65, "eps_start": 1.0, "eps_finish": 0.05,
    "eps_decay": 0.1, "max_grad_norm": 10.0, "reward_scale": 1.0, "hidden": 128, "num_layers": 2, "network": "mlp",
}
GAMES = ("Breakout", "SpaceInvaders", "Asterix", "Freeway")
RUNS += [(f"ppo_{game.lower()}_minatar", "ppo", "single", 1, None, {"env": f"{game}-MinAtar", **MINATAR})
         for game in GAMES]
RUNS += [(f"pqn_{game.lower()}_minatar", "pqn", "single", 1, None, {"env": f"{game}-MinAtar", **PQN_MINATAR})
         for game in GAMES]
RUNS += [("muzero_breakout_minatar", "muzero", "single", 1, None, {"env": "Breakout-MinAtar"})]  # muzero's defaults
"""MinAtar rows have no threshold (a bench, not a check): run them with `--only ppo_breakout_minatar,...`; muzero's
(1e6 steps) against pqn's with `--steps 1000000`."""
CLEANRL_PPO_ATARI = {  # CleanRL's ppo_atari_envpool.py: 8 envs x 128 steps, 4 epochs x 4 minibatches, lr 2.5e-4
    "num_envs": 8, "num_steps": 128, "total_steps": 10_000_000, "lr": 2.5e-4, "anneal_lr": True,  # annealed over
    "update_epochs": 4, "num_minibatches": 4, "gamma": 0.99, "gae_lambda": 0.95, "clip_eps": 0.1,  # 1e7 steps,
    "clip_value": True, "ent_coef": 0.01, "vf_coef": 0.5, "max_grad_norm": 0.5, "network": "nature_cnn",  # clip 0.1
}  # (its env options are src/fragc/algos/host_envs.py's ATARI_OPTIONS); 1e7 steps are days on this CPU: run with --steps
RUNS += [(f"ppo_{game.lower()}_envpool", "ppo", "single", 1, None, {"env": f"envpool:{game}-v5", **CLEANRL_PPO_ATARI})
         for game in ("Breakout", "Pong")]
"""Atari rows: a bench against a random policy's score (bench/random_policy.py), run with `--only` and `--steps`."""
RUNS += [  # JaxMARL's baselines (ippo's defaults: ippo_ff_mpe.yaml, 16 envs x 128 steps, 1e7 steps; mappo's: the
    # same, docs/marl.md; SMAX maps take JaxMARL's SMAX values, preset=auto): benches with no threshold, --only
    ("ippo_mpe_simple_spread", "ippo", "single", 1, None, {}),
    ("mappo_mpe_simple_spread", "mappo", "single", 1, None, {}),
    ("mappo_smax_3m", "mappo", "single", 1, None, {"env": "jaxmarl:SMAX_3m"}),
]
"""Multi-agent rows: run with `--only` (and `--steps`: 1e7 steps of ten seeds are hours on this CPU)."""
DEFAULT = ("ppo", "a2c", "dqn", "impala", "ppo_continuous", "pqn")
"""pqn's ten seeds took 473 s here (as ppo_continuous' 477 s); the masked-CartPole rows run with --only, as a pair
(ppo_rnn_masked_cartpole took 1,616 s, its feed-forward baseline 67 s, the zoo configuration 580 s)."""


def make_algorithm(algo: str, overrides: dict):
    """A built-in algorithm with its config overridden, or `ppo_masked_velocity`: feed-forward ppo on CartPole
    with the velocities removed from the observation (ppo_rnn's `MaskedVelocity` wrapper, as in
    tests/test_ppo_rnn.py's contrast test; ppo itself has no mask option)."""
    from fragc import algos

    if algo == "ppo_masked_velocity":
        from fragc.algos import ppo, ppo_rnn
        from fragc.algos.envs import discrete_env

        class MaskedPPO(ppo.PPO):
            @functools.cached_property
            def env(self):
                return ppo_rnn.MaskedVelocity(discrete_env(self.config.env, "ppo"))

            def greedy_action(self, params, obs):  # the evaluator steps CartPole itself: mask as the runner does
                return super().greedy_action(params, self.env.mask(obs))

        return MaskedPPO(ppo.Config(**overrides))
    return algos.make(algo, **overrides)


def seed_list(text: str) -> list[int]:
    """'0-9' or '0,3,5' -> the seeds."""
    if "-" in text:
        lo, hi = (int(x) for x in text.split("-"))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",")]


class Progress:
    """Called with each dispatch's metrics (`fragc.actions.OnMetrics`): prints each seed's latest return every
    `every` environment steps, and keeps them (`rows`: one per report; a run of several seeds one after another
    reports each seed in turn)."""

    def __init__(self, label: str, steps_per_iteration: int, every: int = 1_000_000):
        self.label, self.steps_per_iteration, self.every = label, steps_per_iteration, every
        self.rows: list[dict] = []
        self.next_report = every

    def __call__(self, done: int, metrics: dict) -> None:
        steps = done * self.steps_per_iteration
        if self.rows and steps < self.rows[-1]["steps"]:  # the next seed's run has started
            self.next_report = self.every
        if steps >= self.next_report:
            def latest(metric: str, digits: int) -> list[float]:  # each seed's value at the dispatch's last iteration
                return [round(float(x), digits) for x in np.atleast_1d(np.asarray(metrics[metric])[..., -1])]

            self.rows.append({"steps": steps, "returns": latest("episode_return", 1)})
            line = f"  {self.label} after {steps:,} steps: returns {self.rows[-1]['returns']}"
            if "win_rate" in metrics:  # SMAX: kept too, so a run cut short still says where its win rate stood
                self.rows[-1]["win_rates"] = latest("win_rate", 2)
                line += f" win rates {self.rows[-1]['win_rates']}"
            self.next_report = (steps // self.every + 1) * self.every
            print(line, flush=True)


def run_length(algo, max_steps: int | None) -> int:
    """Iterations to run: the configured run's, or only its first `max_steps` environment steps (the
    learning-rate schedule stays that of the whole configured run)."""
    iterations = algo.config.iterations
    return iterations if max_steps is None else min(iterations, max(1, max_steps // algo.steps_per_iteration))


CURVES = ("episode_return", "eval_return", "win_rate")
"""The metrics kept at every iteration: the training return, the greedy evaluation's where there is one, and on SMAX
the fraction of environments whose last episode was won (JaxMARL's win rate)."""


def run_row(name: str, algorithm, policy: str, devices: int, seeds: list[int], max_steps: int | None,
            vectorised: bool) -> tuple[dict[str, np.ndarray], dict]:
    """Runs one row's seeds: its curves ([seeds, iterations] each) and what the row's JSON records of the run."""
    iterations = run_length(algorithm, max_steps)
    steps = iterations * algorithm.steps_per_iteration
    progress = Progress(name, algorithm.steps_per_iteration, every=min(1_000_000, max(1, steps // 10)))
    start = time.perf_counter()
    all_curves = learning_curves(algorithm, policy, devices, seeds, iterations, progress, vectorised)
    wall = time.perf_counter() - start
    return all_curves, {
        "seeds": seeds, "vectorised": vectorised, "backend": jax_backend(), "wall_s": round(wall, 1),
        "env_steps": steps, "configured_env_steps": algorithm.config.iterations * algorithm.steps_per_iteration,
        "steps_per_iteration": algorithm.steps_per_iteration,
        "env_steps_per_s": round(len(seeds) * steps / wall),  # compile included: wall clock, not a bench
        "returns_by_steps": progress.rows}


def save_run(out: str, name: str, curves: dict[str, np.ndarray], run: dict) -> None:
    """OUT/NAME_curves.npz and OUT/NAME_run.json: a row's run, before anything summarises it."""
    np.savez(os.path.join(out, f"{name}_curves.npz"), **curves)
    with open(os.path.join(out, f"{name}_run.json"), "w") as f:
        json.dump(run, f, indent=1)


def load_run(out: str, name: str) -> tuple[dict[str, np.ndarray], dict]:
    """What `save_run` wrote (`--from-curves`)."""
    try:
        with np.load(os.path.join(out, f"{name}_curves.npz")) as saved, \
                open(os.path.join(out, f"{name}_run.json")) as f:
            return {k: saved[k] for k in saved.files}, json.load(f)
    except FileNotFoundError as e:
        raise SystemExit(f"bench/results.py: error: no saved run of {name} in {out} ({e.filename})") from None


def learning_curves(algo, policy: str, devices: int, seeds: list[int], iterations: int,
                    progress: Progress, vectorised: bool = False) -> dict[str, np.ndarray]:
    """Each metric of `CURVES` the runs report -> its value at every iteration [seeds, iterations]. `vectorised`:
    a population's members batched (`population(..., exact=False)`), as on a GPU, where members run one after
    another would leave it idle; each member then drifts from its `--seed S` run by float rounding."""
    import fragc
    from fragc.actions import OnMetrics

    on_host = getattr(algo.env, "on_host", False)  # a population steps no host environments: seed by seed
    if policy == "single" and not on_host and seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        # exact: each member is its `fragc run --seed S` run bit for bit; vectorised members drift from those by
        # float rounding that grows over a long run (a pqn row gave 6/10 vectorised where seed-by-seed runs gave 9/10)
        prog = fragc.compile(algo, fragc.population("single", len(seeds), exact=not vectorised), devices=1,
                             iterations_per_dispatch=32)
        _, history = prog.run(prog.init(seeds[0]), iterations, [OnMetrics(progress)])
        return {m: np.asarray(history[m], np.float64) for m in CURVES if m in history}  # [seeds, iterations] each
    prog = fragc.compile(algo, policy, devices=devices, iterations_per_dispatch=32)
    histories = [prog.run(prog.init(seed), iterations, [OnMetrics(progress)])[1] for seed in seeds]
    return {m: np.stack([np.asarray(h[m], np.float64) for h in histories]) for m in CURVES if m in histories[0]}


def jax_backend() -> str:
    import jax

    return f"{jax.default_backend()} ({jax.devices()[0].device_kind}), jax {jax.__version__}"


def summary(name: str, returns: np.ndarray, threshold: float | None, digits: int = 1) -> dict:
    """Each seed's final value of a metric, how many seeds reach `threshold` (None without one), their IQM and
    its 95% confidence interval (`fragc.sinks.stats`), rounded to `digits`."""
    from fragc.sinks import stats

    point, lo, hi = stats.interval_estimates({name: returns})[name]
    return {"final_returns": [round(float(r), digits) for r in returns],
            "at_threshold": None if threshold is None else stats.seeds_at_threshold(returns, threshold),
            "iqm": round(point, digits), "iqm_ci95": [round(lo, digits), round(hi, digits)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0", help="'0-9' or '0,1,2'")
    parser.add_argument("--only", default="", help="comma-separated run names (default: the DEFAULT rows)")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--steps", type=int, default=None,
                        help="stop each run after its first STEPS environment steps (a partial run: the learning-rate "
                             "schedule stays the configured run's); default: the whole run")
    parser.add_argument("--from-curves", action="store_true",
                        help="summarise the runs saved in --out (NAME_curves.npz, NAME_run.json) instead of running")
    parser.add_argument("--vectorised", action="store_true",
                        help="a population's members batched rather than one after another (for a GPU; see "
                             "learning_curves)")
    args = parser.parse_args()
    from fragc.devices import simulate_cpu_devices
    from fragc.ir.errors import FragcError
    from fragc.sinks import stats

    simulate_cpu_devices(8)  # before JAX's backend starts (the runs' devices: at most 8)

    seeds = seed_list(args.seeds)
    only = set(filter(None, args.only.split(",")))
    rows = []
    for name, algo, policy, devices, threshold, overrides in RUNS:
        if name not in (only or DEFAULT):
            continue
        os.makedirs(args.out, exist_ok=True)
        if args.from_curves:
            all_curves, run = load_run(args.out, name)
        else:
            all_curves, run = run_row(name, make_algorithm(algo, overrides), policy, devices, seeds, args.steps,
                                      args.vectorised)
            save_run(args.out, name, all_curves, run)
        curves = all_curves["episode_return"]
        wall, steps, configured_steps = run["wall_s"], run["env_steps"], run["configured_env_steps"]
        try:
            row = {"run": name, "algo": algo, "policy": policy, "config": overrides,
                   "threshold": threshold, **summary(name, curves[:, -1], threshold), **run}
        except FragcError as e:  # rliable missing or broken where the runs ran (a GPU machine's image): they are kept
            print(f"{name}: no summary here ({e}); its curves are in {args.out}: summarise them where rliable "
                  f"works with `python bench/results.py --only {name} --out DIR --from-curves`", flush=True)
            continue
        lines = {name: row}
        if "eval_return" in all_curves:  # each seed's last evaluation of the greedy policy
            row["greedy_eval"] = lines[f"{name} (greedy eval)"] = summary(name, all_curves["eval_return"][:, -1],
                                                                         threshold)
        if "win_rate" in all_curves:  # SMAX: each seed's final win rate (of the environments' last episodes)
            row["win_rate"] = lines[f"{name} (win rate)"] = summary(name, all_curves["win_rate"][:, -1], None, 2)
        rows.append(row)
        partial = "" if steps == configured_steps else f"PARTIAL: {steps:,} of {configured_steps:,} steps  "
        for label, line in lines.items():
            check = "" if threshold is None else f"{line['at_threshold']}/{len(run['seeds'])} >= {threshold:g}  "
            lo, hi = line["iqm_ci95"]
            print(f"{label:22} {policy:20} {partial}{check}IQM {line['iqm']:g} [{lo:g}, {hi:g}]  {wall:.0f} s  "
                  f"returns {line['final_returns']}", flush=True)
        stats.curves_png({name: curves}, (np.arange(curves.shape[1]) + 1) * run["steps_per_iteration"],
                         os.path.join(args.out, f"{name}.png"), title=f"{name} ({policy}, {len(run['seeds'])} seeds)")
        with open(os.path.join(args.out, "results.json"), "w") as f:  # after each run: a stopped job keeps them
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
