"""A Ray call's cost on this machine: plain actor calls against Ray's compiled graphs (`ray.dag`), for two workers
called together as an environment fleet calls them (src/fragc/algos/ray_envs.py), each stepping E HalfCheetah-v5
environments. docs/distributed.md ("Measured on a quiet machine") has the numbers and why compiled graphs were not
built into the fleet.

    python bench/ray_compiled_graph.py [--envs 8] [--calls 300] [--rounds 2]

Prints, per round, the milliseconds a call takes of an empty method (`noop`, the call and transfer alone) and of a
step (`step`), plain (`[w.step.remote(a) for w in workers]`, one `ray.get`) and compiled (one `InputNode`,
`w.step.bind(inp[i])` under a `MultiOutputNode`, `experimental_compile`, `execute`), and the local vector step.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def make_envs(e: int):
    import gymnasium as gym

    envs = gym.vector.SyncVectorEnv([lambda: gym.make("HalfCheetah-v5") for _ in range(e)])
    envs.reset(seed=0)
    return envs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=8, help="environments per worker")
    parser.add_argument("--calls", type=int, default=300, help="calls timed per measurement")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import ray
    from ray.dag import InputNode, MultiOutputNode

    @ray.remote(num_cpus=1)
    class Worker:
        def __init__(self, e: int):
            self.envs = make_envs(e)

        def step(self, actions: np.ndarray) -> np.ndarray:
            obs, reward, terminated, truncated, _ = self.envs.step(actions)
            return np.concatenate([obs.ravel(), reward, terminated, truncated]).astype(np.float32)

        def noop(self, actions: np.ndarray) -> np.ndarray:
            return actions

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    workers = [Worker.remote(args.envs) for _ in range(2)]
    actions = [np.zeros((args.envs, 6), np.float32) for _ in workers]
    ray.get([w.step.remote(a) for w, a in zip(workers, actions)])

    def plain(method: str) -> float:
        start = time.perf_counter()
        for _ in range(args.calls):
            ray.get([getattr(w, method).remote(a) for w, a in zip(workers, actions)])
        return (time.perf_counter() - start) / args.calls * 1e3

    def compiled(method: str) -> float:
        with InputNode() as inp:
            dag = MultiOutputNode([getattr(w, method).bind(inp[i]) for i, w in enumerate(workers)])
        graph = dag.experimental_compile()
        try:
            ray.get(graph.execute(*actions))
            start = time.perf_counter()
            for _ in range(args.calls):
                ray.get(graph.execute(*actions))
            return (time.perf_counter() - start) / args.calls * 1e3
        finally:
            graph.teardown()

    local = make_envs(args.envs)
    start = time.perf_counter()
    for _ in range(args.calls):
        local.step(actions[0])
    print(f"E={args.envs} per worker: local vector step {(time.perf_counter() - start) / args.calls * 1e3:.3f} ms")
    for r in range(args.rounds):
        for method in ("noop", "step"):
            print(f"round {r} {method}: plain {plain(method):.3f} ms, compiled {compiled(method):.3f} ms", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
