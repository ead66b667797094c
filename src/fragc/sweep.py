"""A sweep's run and report (`fragc sweep`, src/fragc/cli/sweep.py): a grid of hyperparameters x seeds as one program.

Every configuration runs with every seed as one `population(POLICY, seeds, **grid)` program (src/fragc/ir/sweep.py), spread
over the devices given. Into `--out` (default `sweeps/ALGO`) go:

- `members.jsonl`: one line per member and iteration: the iteration, its
  environment steps, the member index, seed, starting configuration, `values`
  (its hyperparameters: population-based training changes them), `lineage`
  (whose training its state continues) and each metric's value at that
  iteration (averaged over any environment or agent axis it has). `values`
  and `lineage` are read once per dispatch, as the dispatch ends (after PBT's
  step, which comes at a dispatch's end): the lines of one dispatch carry the
  same ones;
- `checkpoints/`: the whole population's state (`--resume` continues it, first
  dropping the lines after the checkpoint's iteration);
- `summary.json` and `curves.png`: per configuration (under PBT: per starting
  configuration), the IQM of the final returns over seeds (each member's mean over
  the last tenth of its iterations) with its 95% stratified-bootstrap CI (rliable:
  src/fragc/sinks/stats.py), seeds at `--threshold`, the best configuration, learning
  curves with a point per iteration and CI bands, a note where too few seeds make
  the IQM a mean and the CI a min-max, and under PBT each member's values at the end.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fragc.ir.errors import FragcError
from fragc.runtime.actions import Action, Run
from fragc.runtime.reporting import keep_rows_until
from fragc.sinks import stats


@dataclasses.dataclass
class Members:
    """Who the members are: member i has configuration i // len(seeds) and seed seeds[i % len(seeds)]."""

    seeds: list[int]
    grid: dict[str, list]
    steps_per_iteration: int
    pbt: bool = False
    """Population-based training: a member's configuration is where it started (its values change)."""

    def __post_init__(self) -> None:
        self.combos = [dict(zip(self.grid, c)) for c in itertools.product(*self.grid.values())]

    @property
    def configs(self) -> int:
        return len(self.combos)

    @property
    def count(self) -> int:
        return self.configs * len(self.seeds)

    def config(self, member: int) -> dict[str, Any]:
        return self.combos[member // len(self.seeds)]

    def seed(self, member: int) -> int:
        return self.seeds[member % len(self.seeds)]

    def label(self, member: int) -> str:
        return " ".join(f"{k}={v:g}" for k, v in self.config(member).items()) or "default"


class MemberMetrics(Action):
    """One JSON line per member and iteration (see the module docstring); a resumed sweep first drops the
    lines after its checkpoint."""

    def __init__(self, path: str, members: Members):
        self.path, self.members, self.file, self.last = path, members, None, 0

    def on_start(self, run: Run) -> None:
        self.run, self.last = run, run.start
        if run.start:
            keep_rows_until(self.path, run.start)
        self.file = open(self.path, "a" if run.start else "w", encoding="utf-8")

    def on_dispatch(self, iteration: int, state: Any) -> Any:
        if not self.members.grid:  # seeds only: a plain population, no SweepState; each member its own lineage
            return {}, np.arange(self.members.count)
        return jax.tree.map(jnp.copy, (state.hyper, state.lineage))  # copies: the state's buffers are donated

    def on_metrics(self, iteration: int, metrics: dict, queued: Any) -> None:
        """`metrics[k]` is [members, the dispatch's iterations, ...] (a population's iterations are on axis 1):
        a line per iteration from the one after the previous dispatch's to `iteration`, every member at each."""
        hyper, lineage = queued
        first = self.last + 1
        values = {k: per_iteration(k, v, self.members.count, iteration - self.last) for k, v in metrics.items()}
        for i, at in enumerate(range(first, iteration + 1)):
            steps = self.members.steps_per_iteration * at
            for m in range(self.members.count):
                row = {"iteration": at, "env_steps": steps, "member": m, "seed": self.members.seed(m),
                       "config": self.members.config(m), "values": {k: float(v[m]) for k, v in hyper.items()},
                       "lineage": int(lineage[m])}
                row.update({k: float(v[m, i]) for k, v in values.items()})
                self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        self.last = iteration

    def on_end(self, run: Run) -> None:
        if self.file is not None:
            self.file.close()


def per_iteration(name: str, values: Any, members: int, iterations: int) -> np.ndarray:
    """A population's metric from one dispatch, [members, iterations, ...], as [members, iterations]: each
    member's value at each iteration, the mean over the axes after those two (environments, agents)."""
    x = np.asarray(values, np.float64)
    if x.ndim < 2 or x.shape[:2] != (members, iterations):
        raise FragcError(f"sweep: metric '{name}' has shape {x.shape}, not [{members} members, {iterations} "
                         "iterations, ...]")
    return x.reshape(members, iterations, -1).mean(axis=2)


def best_member(metrics: dict) -> str:
    """`  best member 172.9`: the highest of the members' episode returns (each its mean over environments) at a
    dispatch's last iteration. A population's metrics are [members, iterations, ...]."""
    ret = metrics.get("episode_return")
    if ret is None:
        return ""
    last = np.asarray(ret)[:, -1]  # the dispatch's last iteration: a row per member
    return f"  best member {float(np.max(last.reshape(last.shape[0], -1).mean(1))):.1f}"


# ---------------------------------------------------------------- the report


def report(path: str, members: Members, threshold: float | None, out: str, plot: bool = True,
           log: Any = None, metric: str = "episode_return") -> dict:
    """The table (printed on `log`, default stdout), summary.json and curves.png from the members' metric lines
    (one per member and iteration): the curves have a point per iteration, and each member's final score is its mean
    over the last tenth of its iterations (`Window`, `stats.final_window`), in the table and the plot alike."""
    log = log or sys.stdout
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    iterations = sorted({r["iteration"] for r in rows})
    if not rows or metric not in rows[0]:
        raise FragcError(f"the sweep's metrics ({path}) have no '{metric}' to report")
    curve = np.full((members.count, len(iterations)), np.nan)
    at = {it: i for i, it in enumerate(iterations)}
    for r in rows:
        curve[r["member"], at[r["iteration"]]] = r[metric]
    labels = [members.label(c * len(members.seeds)) for c in range(members.configs)]
    per_config = {label: curve[c * len(members.seeds):(c + 1) * len(members.seeds)] for c, label in enumerate(labels)}
    finals = {label: stats.final_scores(c) for label, c in per_config.items()}
    estimates = stats.interval_estimates(finals)
    seeds_at = ({label: (stats.seeds_at_threshold(v, threshold), len(v)) for label, v in finals.items()}
                if threshold is not None else None)
    window = Window(iterations)
    note = stats.few_seeds_note(len(members.seeds))
    heading = "starting configuration" if members.pbt else "configuration"
    print(stats.report_table(estimates, seeds_at, threshold, title=window.title(metric), configuration=heading),
          file=log)
    at_end = _members_at_end(rows, iterations[-1], stats.final_scores(curve)) if members.pbt else None
    if at_end:
        print(_members_table(at_end), file=log)
    if note:
        print(note, file=log)
    summary = {"metric": metric, "iterations": iterations[-1],
               "env_steps": iterations[-1] * members.steps_per_iteration or None, "seeds": members.seeds,
               "final_window": window.summary(), "note": note, "pbt": members.pbt,
               "best": stats.best_configuration(estimates), "threshold": threshold,
               "configurations": [{"config": members.config(c * len(members.seeds)), "label": label,
                                   "iqm": estimates[label][0], "ci95": list(estimates[label][1:]),
                                   "final": [float(x) for x in finals[label]],
                                   "seeds_at_threshold": seeds_at[label][0] if seeds_at else None}
                                  for c, label in enumerate(labels)]}
    if at_end:
        summary["members"] = at_end
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    if plot:
        spi = members.steps_per_iteration or 1
        png = stats.curves_png(per_config, np.asarray(iterations) * spi, os.path.join(out, "curves.png"),
                               ylabel=metric.replace("_", " "), window=tuple(x * spi for x in window.span()),
                               finals={label: estimates[label][0] for label in labels},
                               legend_title=heading if members.pbt else "")
        print(f"wrote {os.path.join(out, 'summary.json')} and {png}", file=log)
    return summary


@dataclasses.dataclass
class Window:
    """The iterations a final score averages: the last `stats.final_window` of the iterations reported (a tenth, at
    least one), each one line per member of members.jsonl and one point of the curves."""

    iterations: list[int]
    """Every iteration reported (1, 2, ..., the last)."""

    def __post_init__(self) -> None:
        self.reports = stats.final_window(len(self.iterations))

    def covered(self) -> tuple[int, int]:
        """The first and last iteration the window averages over (1-based)."""
        return self.iterations[-self.reports], self.iterations[-1]

    def span(self) -> tuple[int, int]:
        """The window on the curves' axis, in iterations: from the end of the iteration before it to its last."""
        first, last = self.covered()
        return first - 1, last

    def title(self, metric: str) -> str:
        first, last = self.covered()
        return (f"final score: each seed's mean {metric} over its last {self.reports} of {len(self.iterations)} "
                f"iterations ({first}-{last}, the last tenth)")

    def summary(self) -> dict:
        """`reports`: how many iterations the window averages, `of`: the iterations reported, `iterations`: the
        window's first and last."""
        return {"reports": self.reports, "of": len(self.iterations), "iterations": list(self.covered())}


def _members_at_end(rows: list[dict], last: int, finals: np.ndarray) -> list[dict]:
    """Under PBT, each member at the end: its seed, starting configuration, values now, lineage, final score."""
    return [{"member": r["member"], "seed": r["seed"], "config": r["config"], "values": r["values"],
             "lineage": r["lineage"], "final": float(finals[r["member"]])}
            for r in sorted(rows, key=lambda r: r["member"]) if r["iteration"] == last]


def _members_table(members: list[dict]) -> str:
    """The members at the end as aligned text: PBT changed their values since their starting configuration."""
    cells = [["member", "seed", "starting configuration", "values at the end", "lineage", "final"]]
    for m in members:
        start = " ".join(f"{k}={v:g}" for k, v in m["config"].items())
        values = " ".join(f"{k}={v:.4g}" for k, v in m["values"].items())
        cells.append([str(m["member"]), str(m["seed"]), start, values, str(m["lineage"]), f"{m['final']:.1f}"])
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(["each member at the end (PBT copies weights and perturbs values; lineage: whose training "
                      "its state continues):", lines[0], "-" * len(lines[0]), *lines[1:]])
