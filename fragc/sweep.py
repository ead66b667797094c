"""A sweep's run and report (`fragc sweep`, fragc/cli/sweep.py): a grid of hyperparameters x seeds as one program.

Every configuration runs with every seed as one `population(POLICY, seeds, **grid)` program (ir/sweep.py), spread
over the devices given. Into `--out` (default `sweeps/ALGO`) go:

- `members.jsonl`: one line per member and dispatch: its member index, seed,
  starting configuration, current values (population-based training changes
  them), `lineage` (whose training its state continues) and each metric's
  mean over the dispatch;
- `checkpoints/`: the whole population's state (`--resume` continues it);
- `summary.json` and `curves.png`: per configuration, the IQM of the final
  returns over seeds with its 95% stratified-bootstrap CI (rliable: fragc/sinks/stats.py),
  seeds at `--threshold`, the best configuration, and learning curves with CI bands.
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
    """One JSON line per member and dispatch (see the module docstring); a resumed sweep first drops the
    lines after its checkpoint."""

    def __init__(self, path: str, members: Members):
        self.path, self.members, self.file, self.last = path, members, None, 0

    def on_start(self, run: Run) -> None:
        self.run = run
        if run.start:
            keep_rows_until(self.path, run.start)
        self.file = open(self.path, "a" if run.start else "w", encoding="utf-8")

    def on_dispatch(self, iteration: int, state: Any) -> Any:
        if not self.members.grid:  # seeds only: a plain population, no SweepState; each member its own lineage
            return {}, np.arange(self.members.count)
        return jax.tree.map(jnp.copy, (state.hyper, state.lineage))  # copies: the state's buffers are donated

    def on_metrics(self, iteration: int, metrics: dict, queued: Any) -> None:
        hyper, lineage = queued
        steps = self.members.steps_per_iteration * iteration
        for m in range(self.members.count):
            row = {"iteration": iteration, "env_steps": steps, "member": m, "seed": self.members.seed(m),
                   "config": self.members.config(m), "values": {k: float(v[m]) for k, v in hyper.items()},
                   "lineage": int(lineage[m])}
            row.update({k: float(np.mean(np.asarray(v)[m])) for k, v in metrics.items()})
            self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        self.last = iteration

    def on_end(self, run: Run) -> None:
        if self.file is not None:
            self.file.close()


class ReportProgress(Action):
    """A line per dispatch on a log that is not a terminal is too many: one line every tenth of the run."""

    def __init__(self, members: Members, out: Any):
        self.members, self.out, self.next = members, out, 0.0

    def on_start(self, run: Run) -> None:
        self.run = run
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())

    def on_metrics(self, iteration: int, metrics: dict, queued: Any) -> None:
        if self.tty or iteration < self.next and iteration < self.run.stop_at:
            return
        self.next = iteration + max(1, self.run.stop_at // 10)
        ret = metrics.get("episode_return")
        best = f", best member {float(np.max(np.mean(np.asarray(ret).reshape(ret.shape[0], -1), 1))):.1f}" \
            if ret is not None else ""
        print(f"  iteration {iteration}/{self.run.stop_at} ({self.run.wall_s:.1f} s){best}", file=self.out)


# ---------------------------------------------------------------- the report


def report(path: str, members: Members, threshold: float | None, out: str, plot: bool = True,
           log: Any = sys.stdout, metric: str = "episode_return") -> dict:
    """The table (printed), summary.json and curves.png from the members' metric lines."""
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
    finals = {label: c[:, -1] for label, c in per_config.items()}
    estimates = stats.interval_estimates(finals)
    seeds_at = ({label: (stats.seeds_at_threshold(v, threshold), len(v)) for label, v in finals.items()}
                if threshold is not None else None)
    print(stats.report_table(estimates, seeds_at, threshold), file=log)
    summary = {"metric": metric, "iterations": iterations[-1],
               "env_steps": iterations[-1] * members.steps_per_iteration or None, "seeds": members.seeds,
               "best": stats.best_configuration(estimates), "threshold": threshold,
               "configurations": [{"config": members.config(c * len(members.seeds)), "label": label,
                                   "iqm": estimates[label][0], "ci95": list(estimates[label][1:]),
                                   "final": [float(x) for x in finals[label]],
                                   "seeds_at_threshold": seeds_at[label][0] if seeds_at else None}
                                  for c, label in enumerate(labels)]}
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    if plot:
        steps = np.asarray(iterations) * (members.steps_per_iteration or 1)
        png = stats.curves_png(per_config, steps, os.path.join(out, "curves.png"), ylabel=metric.replace("_", " "))
        print(f"wrote {os.path.join(out, 'summary.json')} and {png}", file=log)
    return summary
