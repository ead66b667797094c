"""A uniform random policy's score on a host environment, counted as fragc's runs count it: whole games at the
game's own unclipped score for EnvPool's Atari (`HostPool.game_stats`), episodes otherwise. The floor the Atari
rows of bench/results.py are judged against (docs/results.md).

    python bench/random_policy.py --env envpool:Breakout-v5 --games 200 --seed 0

Steps fragc's own host pool (src/fragc/algos/host_envs.py), the one `fragc run` trains on, with CleanRL's Atari options.
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def random_policy_scores(env: str, games: int, seed: int = 0, num_envs: int = 8) -> np.ndarray:
    """The scores of the first `games` games (or episodes) a uniform random policy finishes over `num_envs`
    environments seeded from `seed`."""
    from fragc.algos.host_envs import HOST_POOLS, split_env_name

    backend, env_id = split_env_name(env)
    pool_type = HOST_POOLS[backend]
    action_space = pool_type.spaces(env_id)[1]
    pool = pool_type(env_id, num_envs)
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 2**32, size=(num_envs, 2), dtype=np.uint32)
    pool.reset(keys)
    running = np.zeros(num_envs)
    scores: list[float] = []
    while len(scores) < games:
        actions = rng.integers(0, action_space.n, size=num_envs).astype(np.int32)
        _, reward, terminated, truncated, _, *game = pool.step(actions, keys)
        score, over = game if pool_type.game_stats(env_id) else (reward, terminated | truncated)
        running += score
        for i in np.flatnonzero(over):
            scores.append(float(running[i]))
            running[i] = 0.0
    return np.asarray(scores[:games])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="envpool:Breakout-v5")
    parser.add_argument("--games", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    scores = random_policy_scores(args.env, args.games, args.seed)
    print(json.dumps({"env": args.env, "games": len(scores), "mean": round(float(scores.mean()), 2),
                      "std": round(float(scores.std()), 2), "max": float(scores.max())}))


if __name__ == "__main__":
    main()
