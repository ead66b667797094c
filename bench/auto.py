"""`--policy auto` against an exhaustive bench over the same candidate space, and the cost model's calibration.

    JAX_NUM_CPU_DEVICES=8 python bench/auto.py [--algos ppo,dqn,impala,regression] [--devices 8]
        [--iterations 64] [--repeats 3] [--out bench-out/auto]

For each algorithm: (1) the exhaustive bench: every candidate of the default space (`fragc.search.default_candidates`:
the built-in policies, actor/learner splits, k in 4, 16, 64) compiled (what the passes refuse is skipped), warmed
up, then timed alternately (`--repeats` rounds of >= 16 iterations, whole dispatches) -> the median seconds per
iteration of each; (2) the search, `fragc.search.search`, its decision cache off, on the same space (run first, so
that whatever one process keeps warm from one to the other helps the exhaustive bench, not the search).
Printed: auto's choice, its measured env-steps/s relative to the exhaustive fastest, the search's time relative to
the exhaustive bench's; and per candidate, predicted against measured time per iteration, with Spearman's rank
correlation per algorithm. The persistent compilation cache is off for both. The machine constants of the
model are measured once before both (their time is reported apart: a machine pays it once, then it is cached).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def make_algo(name: str):
    from fragc import algos

    if name == "regression":
        from toy_algos import Regression

        return Regression(num_envs=64)
    return algos.make(name, num_envs=16)


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for m in range(i, j + 1):
                r[order[m]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / den if den else float("nan")


def exhaustive(name: str, space, devices, repeats: int, timed_iterations: int, log) -> tuple[dict, float]:
    import jax

    import fragc
    from fragc.ir.errors import FragcError

    start = time.perf_counter()
    live = []
    for c in space:
        try:
            prog = fragc.compile(make_algo(name), c.policy_arg(), devices=devices, iterations_per_dispatch=c.k)
        except FragcError:
            continue
        state, _ = prog.run(prog.init(0), 1)
        n = c.k * max(1, math.ceil(timed_iterations / c.k))
        live.append([c, prog, state, n, []])
        log(f"  exhaustive: compiled {c.label} ({time.perf_counter() - start:.0f} s in)")
    for _ in range(repeats):
        for entry in live:
            c, prog, state, n, samples = entry
            t0 = time.perf_counter()
            state, _ = prog.run(state, n)
            jax.block_until_ready(state)
            samples.append((time.perf_counter() - t0) / n)
            entry[2] = state
    return {e[0].label: statistics.median(e[4]) for e in live}, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", default="ppo,dqn,impala,regression")
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=64, help="the run length: caps k (default 64)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench-out/auto")
    args = parser.parse_args()
    import jax

    from fragc import search
    from fragc.devices import devices as choose
    from fragc.ir.frontend import trace
    from fragc.options import CompileOptions, SearchOptions
    from fragc.runtime.actions import steps_per_iteration

    jax.config.update("jax_enable_compilation_cache", False)  # both compile from scratch

    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    devs = choose(args.devices)
    t0 = time.perf_counter()
    machine = search.machine_constants(devs)  # the sizes of the default space: what each search reads
    machine_s = time.perf_counter() - t0
    log(f"machine constants in {machine_s:.1f} s")
    results = {"devices": args.devices, "backend": jax.default_backend(), "machine_s": machine_s,
               "machine": dataclasses.asdict(machine), "algos": {}}
    for name in args.algos.split(","):
        algo = make_algo(name)
        hosted = any(f.host_steps for f in trace(algo).fragments.values())
        space = search.default_candidates(args.devices, hosted, args.iterations)
        log(f"{name}: {len(space)} candidates")
        t0 = time.perf_counter()
        prog = search.search(make_algo(name), CompileOptions("auto", devs, search=SearchOptions(
            candidates=space, cache=False, repeats=args.repeats, run_iterations=args.iterations, memory_limit=None,
            log=log, machine=machine)))
        search_s = time.perf_counter() - t0
        measured, exhaustive_s = exhaustive(name, space, devs, args.repeats, 16, log)
        report = prog.auto
        best = min(measured, key=measured.get)
        chosen = report.chosen.label
        rows = {r.candidate.label: r for r in report.rows}
        pairs = [(rows[l].predicted_s, measured[l]) for l in measured if rows[l].predicted_s is not None]
        rho = spearman([p for p, _ in pairs], [m for _, m in pairs])
        steps = steps_per_iteration(algo)
        results["algos"][name] = {
            "candidates": len(space), "runnable": len(measured), "exhaustive_s": exhaustive_s, "search_s": search_s,
            "auto_compiled": report.compiled, "chosen": chosen, "auto_table": report.table(), "exhaustive_best": best,
            "chosen_vs_best": measured[best] / measured[chosen] if chosen in measured else None,
            "spearman": rho, "steps_per_iteration": steps,
            "calibration": {l: {"predicted_s": rows[l].predicted_s, "measured_s": measured[l],
                                "auto_measured_s": rows[l].measured_s} for l in measured}}
        log(f"{name}: auto chose {chosen}, exhaustive best {best}; search {search_s:.1f} s vs exhaustive "
            f"{exhaustive_s:.1f} s; spearman {rho:.2f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "auto.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(format_tables(results))


def format_tables(results: dict) -> str:
    out = ["| algorithm | runnable / candidates | auto's choice | exhaustive fastest | auto's env-steps/s vs fastest "
           "| search s | exhaustive s | search / exhaustive | Spearman (predicted vs measured) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results["algos"].items():
        ratio = f"{r['chosen_vs_best']:.2f}" if r["chosen_vs_best"] is not None else "-"
        out.append(f"| {name} | {r['runnable']} / {r['candidates']} | {r['chosen']} | {r['exhaustive_best']} | "
                   f"{ratio} | {r['search_s']:.1f} | {r['exhaustive_s']:.1f} | "
                   f"{r['search_s'] / r['exhaustive_s']:.2f} | {r['spearman']:.2f} |")
    out += ["", "| algorithm | candidate | predicted ms/it | measured ms/it (exhaustive) |", "|---|---|---|---|"]
    for name, r in results["algos"].items():
        for label, c in sorted(r["calibration"].items(), key=lambda kv: kv[1]["measured_s"]):
            out.append(f"| {name} | {label} | {c['predicted_s'] * 1e3:.2f} | {c['measured_s'] * 1e3:.2f} |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
