"""`fragc bench`'s results: each policy's throughput summary, the table, bench.json and bench.png.

The driver that compiles and times the policies alternately is the command's
(src/fragc/cli/bench.py): it compiles through `fragc.compile`, the layer above.
"""

from __future__ import annotations

import json
import os
import statistics

import numpy as np
from matplotlib.figure import Figure

from fragc.ir.errors import FragcError

from .plots import save_figure


def throughput(row: dict) -> dict:
    """A policy's row's summary: `unit` (env-steps/s where the algorithm says its steps per iteration, else
    iterations/s) and the `median`, `min` and `max` over its timed repeats."""
    known = row["env_steps_per_s"] is not None
    rates = row["env_steps_per_s"] if known else row["iterations_per_s"]
    return {"unit": "env-steps/s" if known else "iterations/s", "median": statistics.median(rates),
            "min": min(rates), "max": max(rates)}


def format_table(rows: dict) -> str:
    unit = next(iter(rows.values()))["unit"] if rows else "env-steps/s"
    w = max([24] + [len(name) + 2 for name in rows])  # a long policy (agent_learners(actors=4,learners=3)) widens it
    lines = [f"{'policy':{w}}{'devices':>8}{unit:>13}{'(min - max)':>22}{'compile s':>11}"
             f"{'collective B/it':>17}{'transfer B/it':>15}{'return':>9}"]
    for name, r in rows.items():
        spread = f"({r['min']:,.0f} - {r['max']:,.0f})"
        ret = f"{r['final_return']:.1f}" if r["final_return"] is not None else "-"
        lines.append(f"{name:{w}}{r['devices']:>8}{r['median']:>13,.0f}{spread:>22}"
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
    names = list(rows)
    x = np.arange(len(names))
    med = np.array([rows[n]["median"] for n in names])
    err = np.array([[med[i] - rows[n]["min"], rows[n]["max"] - med[i]] for i, n in enumerate(names)]).T
    fig = Figure(figsize=(9, 7))
    top, bottom = fig.subplots(2, 1, sharex=True)
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
    save_figure(fig, path)
