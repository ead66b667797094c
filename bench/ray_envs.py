"""Remote environment workers (src/fragc/algos/ray_envs.py) against the local host pool, on a Ray cluster of several raylets
on this machine (`ray.cluster_utils.Cluster`, as Ray tests itself).

    python bench/ray_envs.py [--env gymnasium:HalfCheetah-v5] [--raylets 2] [--seconds 3]
                             [--train-steps 64] [--train-repeats 7] [--train-only]
                             [--out bench/results]

Measures, for the environment's vector of E environments stepped with random actions (no inference):

- `pool`: env-steps/s of this process's pool (`GymnasiumPool`, one core) against a fleet `ray:NxE'` (N workers,
  N x E' = E), one pool stepped send-then-recv, and two pools pipelined (the host loop's G = 2 order: one pool's
  results fetched while the other's workers step);
- scaling: env-steps/s over workers N (1, 2, 4 at fractional CPUs) and environments per worker E';
- the latency of one remote step, split: the Ray call (an empty actor call's round trip), the transfer (a call
  that moves the step's bytes, packed, and steps nothing, less the empty call) and the step (timed inside the worker);

and `train`: fragc PPO (ppo_continuous) env-steps/s, local host loop G=1 and G=2 against the fleet, same cores.

Writes ray_envs.json. Every figure is this machine's, with whatever else runs on it at the time: say so with them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="gymnasium:HalfCheetah-v5")
    parser.add_argument("--num-envs", type=int, default=16, help="E: the environments of the whole vector")
    parser.add_argument("--raylets", type=int, default=2, help="raylets of the local cluster (one CPU each)")
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--train-steps", type=int, default=64, help="PPO's num_steps (0: no training rows)")
    parser.add_argument("--train-repeats", type=int, default=7, help="alternating rounds of the training rows")
    parser.add_argument("--train-only", action="store_true", help="the training rows alone (no pool rows)")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    from fragc.algos.host_envs import HOST_POOLS
    from fragc.algos.ray_envs import RayFleet, pack, unpack
    from fragc.algos.vec_env import split_env_name
    from fragc.ir.host import EnvFleet

    backend, env_id = split_env_name(args.env)
    pool_type = HOST_POOLS[backend]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(args.raylets - 1):
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
    print(f"cluster: {args.raylets} raylets, {ray.cluster_resources().get('CPU')} CPUs; machine: {os.cpu_count()} "
          f"cores, load {os.getloadavg()[0]:.2f}", file=sys.stderr)
    _, action_space = pool_type.spaces(env_id)
    rng = np.random.default_rng(0)
    rows: list[dict] = []

    def actions(n: int) -> np.ndarray:
        low, high = action_space.low, action_space.high
        return rng.uniform(low, high, (n,) + action_space.shape).astype(np.float32)

    def keys(n: int) -> np.ndarray:
        return rng.integers(0, 2**32, (n, 2), dtype=np.uint32)

    def timed(step, n: int) -> tuple[float, float]:
        """(env-steps/s, mean seconds per vector step) of `step()` over `args.seconds`."""
        step()  # warm
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < args.seconds:
            step()
            calls += 1
        dt = time.perf_counter() - t0
        return calls * n / dt, dt / calls

    E = args.num_envs
    if not args.train_only:
        local = pool_type(env_id, E)
        local.reset(keys(E))
        sps, per = timed(lambda: local.step(actions(E), keys(E)), E)
        rows.append({"what": "pool", "where": "local", "workers": 0, "envs_per_worker": E, "sps": sps,
                     "step_ms": per * 1e3})
        print(f"local pool {E} envs: {sps:,.0f} env-steps/s, {per * 1e3:.2f} ms a vector step", file=sys.stderr)

    def fleet_of(n: int, e: int) -> RayFleet:
        cpus = min(1.0, args.raylets / n)
        fleet = RayFleet(EnvFleet(n, e, cpus), pool_type, args.env, 0, False)
        fleet.start()
        return fleet

    for n, e in () if args.train_only else ((1, E), (2, E // 2), (1, E // 2), (1, 1), (2, 1), (4, E // 4)):
        fleet = fleet_of(n, e)
        pool = fleet.pool(tuple(range(n * e)))
        pool.reset(keys(n * e))
        fleet.step_seconds = 0.0
        sps, per = timed(lambda: pool.step(actions(n * e), keys(n * e)), n * e)
        row = {"what": "pool", "where": "ray", "workers": n, "envs_per_worker": e, "sps": sps, "step_ms": per * 1e3}
        # the latency split, on worker 0: an empty call, a call that moves the step's bytes, the step itself
        actor = fleet.actors[0]
        a, k = actions(e), keys(e)
        out = pool.step(actions(n * e), keys(n * e))
        sample = tuple(x[:e] for x in out)
        _, empty = timed(lambda: ray.get(actor.echo.remote()), 1)
        _, moved = timed(lambda: unpack(ray.get(actor.echo.remote(pack(a, k), pack(*sample)))), 1)
        fleet.step_seconds, t0, count = 0.0, time.perf_counter(), 0
        while time.perf_counter() - t0 < args.seconds:
            pool.step(actions(n * e), keys(n * e))
            count += 1
        row.update(call_ms=empty * 1e3, transfer_ms=max(moved - empty, 0.0) * 1e3,
                   worker_step_ms=fleet.step_seconds / (count * n) * 1e3)
        if n == 2:  # the host loop's G = 2 order: pool 1 steps while pool 0's results are fetched
            pools = [fleet.pool(tuple(range(e))), fleet.pool(tuple(range(e, 2 * e)))]
            for p in pools:
                p.reset(keys(e))
            for p in pools:
                p.send(actions(e), keys(e))

            def pipelined() -> None:
                for p in pools:
                    p.recv()
                    p.send(actions(e), keys(e))

            row["pipelined_sps"], _ = timed(pipelined, 2 * e)
            for p in pools:
                p.recv()
        rows.append(row)
        print(f"ray:{n}x{e}: {sps:,.0f} env-steps/s, {per * 1e3:.2f} ms a step (call {row['call_ms']:.2f}, transfer "
              f"{row['transfer_ms']:.2f}, worker step {row['worker_step_ms']:.2f} ms)"
              + (f"; pipelined over 2 pools {row['pipelined_sps']:,.0f}" if "pipelined_sps" in row else ""),
              file=sys.stderr)
        fleet.stop()

    if args.train_steps:
        rows += train_rows(args, E)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "ray_envs.json")
    with open(path, "w") as f:
        json.dump({"env": args.env, "raylets": args.raylets, "cores": os.cpu_count(), "rows": rows}, f, indent=1)
    print(f"wrote {path}")
    ray.shutdown()
    cluster.shutdown()


def train_rows(args: argparse.Namespace, E: int) -> list[dict]:
    """fragc PPO (ppo_continuous) env-steps/s: the local host loop against the fleet (`ray:2`), with G = 1 and then
    with G = 2 environment groups; in each pair the two programs alternate, `--train-repeats` rounds of 2
    iterations, and the ratio is the median of the per-round ratios (the fleet's workers idle while the local
    loop runs; both fleets at once would need 4 CPUs)."""
    import fragc
    from fragc.algos import ppo_continuous

    config = ppo_continuous.Config(env=args.env, num_envs=E, num_steps=args.train_steps, num_minibatches=4,
                                   update_epochs=1)
    rows = []
    for groups in (1, 2):
        sides = {}
        for label, fleet in ((f"local G={groups}", None), (f"ray:2 G={groups}", "ray:2")):
            prog = fragc.compile(ppo_continuous.PPOContinuous(config), "single", env_groups=groups, env_fleet=fleet,
                                 iterations_per_dispatch=1)
            state, _ = prog.run(prog.init(0), 1)  # warm
            sides[label] = [prog, state, []]
        for r in range(args.train_repeats):
            for label in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
                prog, state, times = sides[label]
                t0 = time.perf_counter()
                sides[label][1], _ = prog.run(state, 2)
                times.append(time.perf_counter() - t0)
        (local, (_, _, local_times)), (remote, (prog, _, remote_times)) = sides.items()
        ratio = statistics.median(a / b for a, b in zip(local_times, remote_times))
        for label, times in ((local, local_times), (remote, remote_times)):
            sps = 2 * E * args.train_steps / statistics.median(times)
            rows.append({"what": "train", "where": label, "sps": sps, "seconds": times,
                         **({"ratio_to_local": ratio} if label == remote else {})})
            print(f"train {label}: {sps:,.0f} env-steps/s" + (f"; / local (median of {args.train_repeats} "
                  f"alternating rounds) {ratio:.2f}" if label == remote else ""), file=sys.stderr)
        prog.algo.env.fleet.stop()
    return rows


if __name__ == "__main__":
    main()
