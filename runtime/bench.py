"""Benchmarking distribution strategies on one algorithm configuration.

Policies are timed alternately (A B C, A B C, ...) so that drift on a noisy
machine hits all of them equally; medians and spread (min, max) are reported.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any, Callable

import numpy as np

from fragc.ir.errors import FragcError

from .actions import steps_per_iteration


def run_bench(make_algo: Callable[[], Any], policies: list[str], devices: Any, iterations: int, repeats: int,
              log: Callable[[str], None] = print) -> dict:
    """Per policy: compile time, devices, bytes moved per iteration, and throughput per timed repeat: env steps
    per second where the algorithm says its steps per iteration (`env_steps_per_s`, else None), iterations per
    second always (`iterations_per_s`); `median`, `min` and `max` are of the first known of the two (`unit`)."""
    import fragc
    from fragc.api import default_device_count

    programs, rows = {}, {}
    for name in policies:
        algo = make_algo()
        one_device = default_device_count(name) == 1
        t0 = time.perf_counter()
        prog = fragc.compile(algo, name, devices=None if one_device else devices)
        compile_s = time.perf_counter() - t0
        cost = prog.cost()["total"]
        state, _ = prog.run(prog.init(0), iterations)  # warm-up: first dispatches, transfers, caches
        runs = len(prog.policy.population) or 1
        programs[name] = [prog, state, runs * steps_per_iteration(algo) * iterations]
        rows[name] = {"compile_s": compile_s, "devices": len(prog.devices),
                      "collective_bytes_per_iteration": cost["collective_bytes"],
                      "transfer_bytes_per_iteration": cost["transfer_bytes"], "iterations_per_s": [],
                      "env_steps_per_s": [] if programs[name][2] else None, "final_return": None}
        log(f"compiled {name} in {compile_s:.1f} s")
    for r in range(repeats):
        for name, entry in programs.items():
            prog, state, steps = entry
            start = time.perf_counter()
            state, history = prog.run(state, iterations)
            _block(state)
            seconds = time.perf_counter() - start
            rows[name]["iterations_per_s"].append(iterations / seconds)
            if steps:
                rows[name]["env_steps_per_s"].append(steps / seconds)
            if "episode_return" in history:
                rows[name]["final_return"] = float(np.mean(np.asarray(history["episode_return"])[..., -1]))
            entry[1] = state
        log(f"repeat {r + 1}/{repeats} done")
    for row in rows.values():
        unit = "env-steps/s" if row["env_steps_per_s"] is not None else "iterations/s"
        rates = row["env_steps_per_s"] if row["env_steps_per_s"] is not None else row["iterations_per_s"]
        row.update(unit=unit, median=statistics.median(rates), min=min(rates), max=max(rates))
    return rows


def _block(state: Any) -> None:
    import jax

    jax.block_until_ready(state)


def format_table(rows: dict) -> str:
    unit = next(iter(rows.values()))["unit"] if rows else "env-steps/s"
    lines = [f"{'policy':24}{'devices':>8}{unit:>13}{'(min - max)':>22}{'compile s':>11}"
             f"{'collective B/it':>17}{'transfer B/it':>15}{'return':>9}"]
    for name, r in rows.items():
        spread = f"({r['min']:,.0f} - {r['max']:,.0f})"
        ret = f"{r['final_return']:.1f}" if r["final_return"] is not None else "-"
        lines.append(f"{name:24}{r['devices']:>8}{r['median']:>13,.0f}{spread:>22}"
                     f"{r['compile_s']:>11.1f}{r['collective_bytes_per_iteration']:>17,.0f}"
                     f"{r['transfer_bytes_per_iteration']:>15,.0f}{ret:>9}")
    return "\n".join(lines)


def write_outputs(rows: dict, config: dict, out_dir: str) -> tuple[str, str]:
    try:
        os.makedirs(out_dir, exist_ok=True)
        json_path = os.path.join(out_dir, "bench.json")
        with open(json_path, "w") as f:
            json.dump({"config": config, "policies": rows}, f, indent=2)
    except OSError as err:
        raise FragcError(f"cannot write benchmark results to '{out_dir}': {err.strerror}") from err
    png_path = os.path.join(out_dir, "bench.png")
    plot_bench(rows, config, png_path)
    return json_path, png_path


def plot_bench(rows: dict, config: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    x = np.arange(len(names))
    med = np.array([rows[n]["median"] for n in names])
    err = np.array([[med[i] - rows[n]["min"], rows[n]["max"] - med[i]] for i, n in enumerate(names)]).T
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    top.bar(x, med, yerr=err, capsize=4, color="tab:blue")
    top.set_ylabel(f"{rows[names[0]]['unit']} (median, min-max)")
    top.set_title(f"{config.get('algo')} · {config.get('devices')} devices · {config.get('iterations')} iterations "
                  f"x {config.get('repeats')} repeats ({config.get('backend')})")
    coll = [rows[n]["collective_bytes_per_iteration"] / 1024 for n in names]
    trans = [rows[n]["transfer_bytes_per_iteration"] / 1024 for n in names]
    bottom.bar(x - 0.2, coll, 0.4, label="collectives", color="tab:orange")
    bottom.bar(x + 0.2, trans, 0.4, label="transfers", color="tab:green")
    bottom.set_ylabel("KiB moved per iteration")
    bottom.legend()
    bottom.set_xticks(x, names, rotation=20, ha="right")
    for ax in (top, bottom):
        ax.grid(axis="y", alpha=0.3)
    from .plots import save_figure

    save_figure(fig, path)
