"""fragc's alphazero against pgx's own examples/alphazero/train.py on Connect Four, side by side.

The reference is pgx's file itself, built at a pinned revision by `python bench/references/build.py` into
bench/references/build/pgx_alphazero/ (patches: no baseline download; jax.device_put_replicated rebuilt). Without it
this bench says so and stops. Its configuration comes from the command line as its users give it (`sys.argv`, read
by OmegaConf when `train` is imported); its training loop lives in its `__main__` block, so `reference_iteration`
below follows that block step for step: self-play and `compute_loss_input` (pmapped), the samples fetched to the
host, shuffled with `jax.random.permutation`, split into minibatches of `training_batch_size`, one pmapped `train`
call each, each call's losses read (`.item()`), as the block does. Its `evaluate` (pgx's debugging evaluation) is not
timed.

Both sides run the same configuration (`CONFIG`): 64 games of 64 moves an iteration, 32 simulations, a ResNet of 2
blocks of 32 channels, minibatches of 512, Adam at 1e-3; fragc's `alphazero` with `eval_games=0`. What differs:
- the network: pgx's haiku AZNet (convolutions with biases; BatchNorm's averages zero-debiased), fragc's flax one
  (no convolution biases: each feeds a BatchNorm; flax's averages). pgx initialises its network from PRNGKey(0)
  whatever the seed; fragc from the seed.
- keys: pgx draws one Gumbel noise per device batch, fragc one per game (so its games do not depend on the split).

Modes:
- `speed`: one process, sides alternating (A B A B): a whole iteration each (self-play and learning), and self-play
  alone (fragc: the algorithm's `selfplay` fragment in a program of its own). Ratios are pgx's time / fragc's (above
  1, fragc is faster). The learner's share is the iteration's time less self-play's.
- `learn`: each side trains `--iterations` from each of `--seeds`, then this bench plays each final network, with
  its search (`num_simulations`, no Gumbel noise), as one player of `--games` Connect Four games (pgx's `init`
  draws who starts) against (a) a uniform random player and (b) a fixed searcher: mctx's Gumbel search with the
  same simulations, a uniform prior and the outcome of one uniformly random playout as each leaf's value. pgx's
  pretrained baselines download their weights, which this machine cannot. The same evaluation code plays both
  sides' networks.

    python bench/alphazero_reference.py --mode speed --repeats 5
    python bench/alphazero_reference.py --mode learn --iterations 20 --seeds 0-4 --games 128
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import references_built as references  # noqa: E402
import side_by_side  # noqa: E402

from fragc.runtime import cpu_lowering  # noqa: E402,F401  (before any jit: its jit-cache state)

NAME = "pgx_alphazero"
CONFIG = {"env_id": "connect_four", "num_channels": 32, "num_layers": 2, "selfplay_batch_size": 64,
          "num_simulations": 32, "max_num_steps": 64, "training_batch_size": 512, "learning_rate": 0.001}
"""pgx's Config fields, as `python train.py key=value ...` gives them."""


def reference_module(seed: int = 0):
    """pgx's train.py imported with `CONFIG` (and `seed`) on its command line; re-imported where it was already."""
    os.environ.setdefault("WANDB_MODE", "disabled")
    sys.argv = ["train.py", *(f"{k}={v}" for k, v in {**CONFIG, "seed": seed}.items())]
    if "train" in sys.modules:
        return importlib.reload(sys.modules["train"])
    return references.load(NAME, "train")


def fragc_algo(**overrides):
    from fragc.algos import make

    c = CONFIG
    return make("alphazero", env=f"pgx:{c['env_id']}", num_envs=c["selfplay_batch_size"], num_steps=c["max_num_steps"],
                num_simulations=c["num_simulations"], batch_size=c["training_batch_size"], lr=c["learning_rate"],
                channels=c["num_channels"], blocks=c["num_layers"], eval_games=0, **overrides)


# ---------------------------------------------------------------- pgx's side, as its __main__ block runs it


class Reference:
    """pgx's model, optimizer state and key, replicated over its devices as its __main__ block makes them."""

    def __init__(self, train, seed: int):
        import jax
        import jax.numpy as jnp

        self.train = train
        dummy = jax.vmap(train.env.init)(jax.random.split(jax.random.PRNGKey(0), 2)).observation
        model = train.forward.init(jax.random.PRNGKey(0), dummy)
        opt_state = train.optimizer.init(params=model[0])
        sharding = jax.NamedSharding(jax.sharding.Mesh(train.devices, ("i",)), jax.P("i"))
        self.model, self.opt_state = jax.tree.map(
            lambda x: jax.device_put(jnp.stack([x] * train.num_devices), sharding), (model, opt_state))
        self.rng_key = jax.random.PRNGKey(seed)

    def selfplay(self):
        import jax

        self.rng_key, subkey = jax.random.split(self.rng_key)
        keys = jax.random.split(subkey, self.train.num_devices)
        return jax.block_until_ready(self.train.compute_loss_input(self.train.selfplay(self.model, keys)))

    def learn(self, samples) -> float:
        import jax
        import jax.numpy as jnp

        train, c = self.train, self.train.config
        samples = jax.device_get(samples)
        samples = jax.tree.map(lambda x: x.reshape((-1, *x.shape[3:])), samples)
        self.rng_key, subkey = jax.random.split(self.rng_key)
        ixs = jax.random.permutation(subkey, jnp.arange(samples.obs.shape[0]))
        samples = jax.tree.map(lambda x: x[ixs], samples)
        num_updates = samples.obs.shape[0] // c.training_batch_size
        minibatches = jax.tree.map(lambda x: x.reshape((num_updates, train.num_devices, -1) + x.shape[1:]), samples)
        losses = []
        for i in range(num_updates):
            minibatch = jax.tree.map(lambda x: x[i], minibatches)
            self.model, self.opt_state, policy_loss, value_loss = train.train(self.model, self.opt_state, minibatch)
            losses.append(policy_loss.mean().item() + value_loss.mean().item())
        return sum(losses) / len(losses)

    def iteration(self) -> float:
        return self.learn(self.selfplay())

    def network(self):
        """(obs [B, H, W, C]) -> (logits, value) of the first device's copy, in evaluation mode."""
        import jax

        params, state = jax.tree.map(lambda x: x[0], self.model)
        return lambda obs: self.train.forward.apply(params, state, obs, is_eval=True)[0]


# ---------------------------------------------------------------- fragc's side


def fragc_program(algo, policy: str = "single"):
    import fragc

    return fragc.compile(algo, policy)


def selfplay_only(algo):
    """The algorithm whose iteration is its `selfplay` fragment alone (the state's game keys advanced)."""
    cls = type(algo)

    class SelfplayOnly(cls):
        def iteration(self, state):
            samples, game_keys, metrics = self.selfplay(self.policy_params(state), state.game_keys)
            return state.replace(game_keys=game_keys), metrics

    return SelfplayOnly(algo.config)


def learn_only(algo, samples):
    """The algorithm whose iteration is its `learn` fragment alone, on the same `samples` ([T, N, ...] arrays of
    one self-play window) each time."""
    cls = type(algo)

    class LearnOnly(cls):
        def iteration(self, state):
            learner, metrics = self.learn(state.learner, samples)
            return state.replace(learner=learner), metrics

    return LearnOnly(algo.config)


def fragc_network(algo, state):
    model = algo.policy_params(state)
    return lambda obs: algo.evaluate(model, obs)


# ---------------------------------------------------------------- speed


def speed(repeats: int, out: str) -> dict:
    import jax

    from fragc.algos import alphazero

    train = reference_module(0)
    ref = Reference(train, 0)
    window_of_pgx = ref.selfplay()
    algo = fragc_algo()
    window = jax.tree.map(lambda x: x[0], ref.selfplay())  # one window of pgx's self-play: [T, N, ...]
    samples = alphazero.Sample(window.obs, window.policy_tgt, window.value_tgt, window.mask)
    whole, alone, learner = (fragc_program(a) for a in (algo, selfplay_only(algo), learn_only(algo, samples)))
    held = {"whole": whole.init(0), "alone": alone.init(0), "learner": learner.init(0)}

    def fragc_run(name, prog):
        def run(_seed: int = 0) -> None:
            held[name] = jax.block_until_ready(prog.run(held[name], 1)[0])
        return run

    sides = {"iteration": {NAME: (ref.iteration, lambda _s: ref.iteration()),
                           "fragc": (fragc_run("whole", whole), fragc_run("whole", whole))},
             "selfplay": {NAME: (ref.selfplay, lambda _s: ref.selfplay()),
                          "fragc": (fragc_run("alone", alone), fragc_run("alone", alone))},
             "learn": {NAME: (lambda: ref.learn(window_of_pgx), lambda _s: ref.learn(window_of_pgx)),
                       "fragc": (fragc_run("learner", learner), fragc_run("learner", learner))}}
    results = {}
    for what, pair in sides.items():
        print(f"\n{what}:", flush=True)
        raw = side_by_side.steady(pair, repeats)
        results[what] = side_by_side.summary(raw, "steady", NAME, "pgx", f"{what}: pgx's / fragc's time", out,
                                             f"alphazero_reference_{what}", config=CONFIG,
                                             processor=references.processor(),
                                             reference=references.require(NAME)["commit"])
    moves = CONFIG["selfplay_batch_size"] * CONFIG["max_num_steps"]
    updates = moves // CONFIG["training_batch_size"]
    for side in (NAME, "fragc"):
        it, sp, lr = (results[w]["wall_s"]["medians_s"][side] for w in ("iteration", "selfplay", "learn"))
        print(f"{side:14} iteration {moves / it:5.0f} moves/s; self-play {moves / sp:5.0f} moves/s "
              f"({moves / CONFIG['max_num_steps'] / sp:.1f} game slots of 64 moves/s); learner {updates / lr:5.1f} "
              "updates/s")
    return results


# ---------------------------------------------------------------- learning


def search_player(env, network, num_simulations: int, rollout: bool = False):
    """(key, games) -> actions: mctx's Gumbel search (no Gumbel noise) with `network`'s prior and values, or with a
    uniform prior and one uniformly random playout's outcome as each leaf's value (`rollout`)."""
    import jax
    import jax.numpy as jnp
    import mctx

    from fragc.algos import alphazero

    def playout(key, games):
        """The outcome for the player to move at each of `games` of uniformly random moves to the end."""
        to_move = games.current_player

        def body(carry):
            games, key, total = carry
            key, draw = jax.random.split(key)
            legal = jnp.where(games.legal_action_mask, 0.0, -jnp.inf)
            games = jax.vmap(env.step)(games, jax.random.categorical(draw, legal))
            return games, key, total + alphazero.mover_reward(games, to_move)

        return jax.lax.while_loop(lambda c: ~jnp.all(c[0].terminated), body,
                                  (games, key, jnp.zeros(to_move.shape[0])))[2]

    def evaluate(key, games):
        if rollout:
            return jnp.zeros(games.legal_action_mask.shape), playout(key, games)
        return network(games.observation)

    recurrent_fn = alphazero.game_model(env, lambda params, key, games: evaluate(key, games))  # fragc's, pgx's

    def act(key, games):
        k1, k2 = jax.random.split(key)
        logits, value = evaluate(k1, games)
        root = mctx.RootFnOutput(prior_logits=logits, value=value, embedding=games)
        return mctx.gumbel_muzero_policy(None, k2, root, recurrent_fn, num_simulations,
                                         invalid_actions=~games.legal_action_mask,
                                         qtransform=mctx.qtransform_completed_by_mix_value, gumbel_scale=0.0).action

    return act


def play(env, agent, opponent, games: int, seed: int) -> dict:
    """`games` games of `agent` (player 0) against `opponent` -> its win, draw and loss rates."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    @jax.jit
    def run(key):
        key, start = jax.random.split(key)
        state = jax.vmap(env.init)(jax.random.split(start, games))

        def body(carry):
            state, key, total = carry
            key, k1, k2 = jax.random.split(key, 3)
            ours = jnp.where(state.terminated, 0, agent(k1, state))
            theirs = jnp.where(state.terminated, 0, opponent(k2, state))
            state = jax.vmap(env.step)(state, jnp.where(state.current_player == 0, ours, theirs))
            return state, key, total + state.rewards[:, 0]

        return jax.lax.while_loop(lambda c: ~jnp.all(c[0].terminated), body, (state, key, jnp.zeros(games)))[2]

    total = np.asarray(run(jax.random.PRNGKey(1000 + seed)))
    return {"win": float(np.mean(total > 0)), "draw": float(np.mean(total == 0)), "loss": float(np.mean(total < 0))}


def uniform_player(key, games):
    import jax
    import jax.numpy as jnp

    return jax.random.categorical(key, jnp.where(games.legal_action_mask, 0.0, -jnp.inf))


def learn(iterations: int, seeds: list[int], games: int, out: str) -> dict:
    import jax

    rows = []
    for seed in seeds:
        for side in (NAME, "fragc"):
            start = time.perf_counter()
            if side == NAME:
                train = reference_module(seed)
                ref = Reference(train, seed)
                for _ in range(iterations):
                    ref.iteration()
                env, network = train.env, ref.network()
            else:
                algo = fragc_algo(total_steps=iterations * CONFIG["selfplay_batch_size"] * CONFIG["max_num_steps"])
                prog = fragc_program(algo)
                state, _ = prog.run(prog.init(seed), iterations)
                env, network = algo.game, fragc_network(algo, jax.device_get(state))
            trained_s = time.perf_counter() - start
            agent = search_player(env, network, CONFIG["num_simulations"])
            row = {"side": side, "seed": seed, "train_s": trained_s,
                   "vs_random": play(env, agent, uniform_player, games, seed),
                   "vs_rollout_search": play(env, agent, search_player(env, None, CONFIG["num_simulations"], True),
                                             games, seed)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary = {}
    for side in (NAME, "fragc"):
        mine = [r for r in rows if r["side"] == side]
        summary[side] = {opp: {k: statistics.mean(r[opp][k] for r in mine) for k in ("win", "draw", "loss")}
                         for opp in ("vs_random", "vs_rollout_search")}
        print(side, json.dumps(summary[side]))
    result = {"config": CONFIG, "iterations": iterations, "seeds": seeds, "games": games, "rows": rows,
              "summary": summary, "processor": references.processor(), "reference": references.require(NAME)["commit"]}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"alphazero_reference_learn_{iterations}.json"), "w") as f:
        json.dump(result, f, indent=1)
    return result


def seed_list(text: str) -> list[int]:
    if "-" in text:
        low, high = map(int, text.split("-"))
        return list(range(low, high + 1))
    return [int(s) for s in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("speed", "learn"), default="speed")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--seeds", type=seed_list, default=[0, 1, 2, 3, 4])
    parser.add_argument("--games", type=int, default=128)
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args()
    references.require(NAME)
    if args.mode == "speed":
        speed(args.repeats, args.out)
    else:
        learn(args.iterations, args.seeds, args.games, args.out)


if __name__ == "__main__":
    main()
