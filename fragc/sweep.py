"""`fragc sweep`: a grid of hyperparameters x seeds as one program, with a statistical report.

    fragc sweep ppo --lr 1e-4,3e-4,1e-3 --ent-coef 0,0.01 --seeds 0-9 [--devices N] [--pbt-every K]

A config option given several values (comma-separated) is an axis of the
grid; given one, it sets the config as under `fragc run`. Every configuration
runs with every seed as one `population(POLICY, seeds, **grid)` program
(ir/sweep.py), spread over the devices given. Into `--out` (default
`sweeps/ALGO`) go:

- `members.jsonl`: one line per member and dispatch: its member index, seed,
  starting configuration, current values (population-based training changes
  them), `lineage` (whose training its state continues) and each metric's
  mean over the dispatch;
- `checkpoints/`: the whole population's state (`--resume` continues it);
- `summary.json` and `curves.png`: per configuration, the IQM of the final
  returns over seeds with its 95% stratified-bootstrap CI (rliable: fragc/stats.py),
  seeds at `--threshold`, the best configuration, and learning curves with CI bands.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

import numpy as np

from fragc.ir.errors import FragcError
from fragc.runtime.actions import Action, Run


def add_parser(sub: Any, algo: str | None) -> argparse.ArgumentParser:
    """`fragc sweep`'s options; with `algo` known, its config fields, each taking one value or a list."""
    from fragc import cli

    p = sub.add_parser("sweep", help="train a grid of hyperparameters x seeds as one program; report IQM and 95%% CIs")
    cli._algo_argument(p)
    p.add_argument("--seeds", type=seed_list, default=list(range(10)), metavar="SEEDS",
                   help="seeds of every configuration: 0-9 or 0,3,5 (default 0-9)")
    p.add_argument("--policy", default="single", help="the members' policy (default single; one device group only)")
    p.add_argument("--devices", type=cli._count, default=None,
                   help="devices to spread the members over (default 1; simulated on CPU if needed)")
    p.add_argument("--exact", action="store_true",
                   help="run each device's members one after another, each bit for bit its single run "
                        "(default: vectorised, faster, equal to the last bits)")
    p.add_argument("--iterations", type=cli._count, default=None, metavar="N",
                   help="train N iterations (default: the config's total_steps)")
    p.add_argument("--iterations-per-dispatch", type=cli._count, default=16)
    p.add_argument("--pbt-every", type=cli._count, default=None, metavar="K",
                   help="population-based training: every K iterations the worst quarter copies the best quarter "
                        "and perturbs its hyperparameters (runtime/pbt.py)")
    p.add_argument("--pbt-metric", default="episode_return", metavar="METRIC",
                   help="the metric PBT ranks members by (default episode_return)")
    p.add_argument("--pbt-seed", type=cli._seed, default=0, help="seed of PBT's draws (default 0)")
    p.add_argument("--threshold", type=float, default=None, help="report how many seeds reach this final return")
    p.add_argument("--out", default=None, metavar="DIR", help="where the sweep writes (default sweeps/ALGO)")
    p.add_argument("--checkpoint-every", type=cli._count, default=64, metavar="K",
                   help="iterations between checkpoints (default 64)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    p.add_argument("--stop-after", type=cli._count, default=None, metavar="K",
                   help="run at most K iterations now (checkpointed), to be continued with --resume")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--no-plot", action="store_true", help="do not draw curves.png")
    if algo is not None:
        cli._config_options(p, algo, values=_values, description="one value sets the field; several (a,b,c) sweep it")
    return p


def _values(kind: Any) -> Any:
    def parse(text: str) -> list:
        items = [t.strip() for t in text.split(",")]
        if not all(items):
            raise argparse.ArgumentTypeError(f"expected a value or a comma-separated list, got {text!r}")
        return [kind(t) for t in items]

    parse.__name__ = getattr(kind, "__name__", "value")
    return parse


def seed_list(text: str) -> list[int]:
    """'0-9' or '0,3,5' -> the seeds, each in 0 .. 2**32 - 1, no seed twice."""
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-"))
            seeds = list(range(lo, hi + 1))
        else:
            seeds = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds are 0-9 or 0,3,5, got {text!r}") from None
    if not seeds or min(seeds) < 0 or max(seeds) > 2**32 - 1 or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"seeds must be distinct, in 0 .. 2**32 - 1, at least one: got {text!r}")
    return seeds


# ---------------------------------------------------------------- the run


def cmd_sweep(args: argparse.Namespace) -> int:
    import fragc
    from fragc import algos, cli
    from fragc.devices import devices
    from fragc.runtime.actions import steps_per_iteration
    from fragc.runtime.reporting import enable_compilation_cache
    from fragc.runtime.stopping import Stopped
    from fragc.training import algo_meta, train

    given = {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg_") and v is not None}
    fixed = {k: v[0] for k, v in given.items() if len(v) == 1}
    grid = {k: v for k, v in given.items() if len(v) > 1}
    if not grid and len(args.seeds) < 2:
        raise FragcError("a sweep needs several seeds or a config option with several values (--lr 1e-4,3e-4)")
    out = args.out or os.path.join("sweeps", os.path.basename(args.algo).replace(":", "_"))
    devices(args.devices)
    enable_compilation_cache()
    algo = algos.make(args.algo, **fixed)
    iterations = _iterations(algo, args)
    steps = steps_per_iteration(algo)
    k = args.iterations_per_dispatch
    pbt = fragc.PBT(args.pbt_every, args.pbt_metric, seed=args.pbt_seed) if args.pbt_every else None
    run_info = {"algo": args.algo, "seeds": args.seeds, "grid": grid, "pbt_every": args.pbt_every}
    os.makedirs(out, exist_ok=True)
    checkpoints = cli._open_checkpoints(os.path.join(out, "checkpoints"))
    with checkpoints:
        if args.resume:
            checkpoints.check_run(algo_meta(algo, run_info))
        prog = fragc.compile(algo, fragc.population(args.policy, args.seeds, exact=args.exact, pbt=pbt, **grid),
                             devices=args.devices, iterations_per_dispatch=k)
        members = Members(args.seeds, grid, steps)
        log = sys.stderr if args.json else sys.stdout
        print(f"fragc sweep {args.algo}: {members.configs} configuration(s) x {len(args.seeds)} seed(s) = "
              f"{members.count} members on {_mesh_size(prog)} device(s), {iterations} iterations"
              + (f" x {steps} env steps" if steps else "") + f", compiled in {prog.compile_seconds:.1f} s", file=log)
        writer = MemberMetrics(os.path.join(out, "members.jsonl"), members)
        try:
            train(prog, prog.init(0), iterations, checkpoint_dir=checkpoints, checkpoint_every=args.checkpoint_every,
                  resume=args.resume, progress=log, stop_after=args.stop_after, run_info=run_info,
                  actions=[writer, ReportProgress(members, log)])
        except Stopped as stop:
            print(f"fragc: {stop}; its checkpoint continues with --resume", file=sys.stderr)
            return stop.exit_code
    if args.stop_after and writer.last < iterations:
        print(f"stopped after iteration {writer.last} of {iterations}: continue with --resume", file=log)
        return 0
    summary = report(os.path.join(out, "members.jsonl"), members, args.threshold, out, plot=not args.no_plot,
                     log=log)
    if args.json:
        print(json.dumps(summary))
    return 0


def _iterations(algo: Any, args: argparse.Namespace) -> int:
    if args.iterations is not None:
        return args.iterations
    iterations = getattr(getattr(algo, "config", None), "iterations", None)
    if not isinstance(iterations, int) or iterations < 1:
        raise FragcError(f"{args.algo}: a sweep needs its run length: pass --iterations N or --total-steps N")
    return iterations


def _mesh_size(prog: Any) -> int:
    mesh = getattr(prog._executor, "population_mesh", None)
    return mesh.devices.size if mesh is not None else len(prog.devices)


@dataclasses.dataclass
class Members:
    """Who the members are: member i has configuration i // len(seeds) and seed seeds[i % len(seeds)]."""

    seeds: list[int]
    grid: dict[str, list]
    steps_per_iteration: int

    def __post_init__(self) -> None:
        import itertools

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
        from fragc.runtime.reporting import _keep_rows_until

        self.run = run
        if run.start:
            _keep_rows_until(self.path, run.start)
        self.file = open(self.path, "a" if run.start else "w", encoding="utf-8")

    def on_dispatch(self, iteration: int, state: Any) -> Any:
        import jax
        import jax.numpy as jnp

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
    from fragc import stats

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
