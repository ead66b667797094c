"""Timing fragc beside a reference's own code: what bench/ppo_reference.py, ippo_reference.py and pqn_reference.py
share.

- `steady`: one process, each side compiled (and run once), then timed alternately (A B A B ...): wall and process
  CPU time per round.
- `fresh`: each run in a new process (the bench's own script with `--child SIDE`, which prints {"compile_s",
  "train_s"} as JSON), sides alternating: its training time and the whole process's wall time. A reference's
  process keeps XLA's own CPU threads (`FRAGC_CPU_THREADS=xla`: the bench script imports fragc, which would
  otherwise choose them, src/fragc/runtime/cpu_threads.py); in `steady` both sides share the process's.
- `spinning(n)`: n processes spinning on a core each meanwhile (`--busy N`: "one other busy process" is 1).
- `summary`: ratios of the reference's time to fragc's (above 1: fragc is faster), medians and each round's.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Iterator

Side = tuple[Callable[[], None], Callable[[int], None]]
"""(compile(), run(seed)): compile() builds the side's program and runs it once; run(seed) trains one whole run and
waits for it."""


def steady(sides: dict[str, Side], repeats: int) -> dict:
    """One process: every side compiled, then timed alternately; -> {"wall_s", "cpu_s": side -> seconds a round,
    "loads"}."""
    for compile_, _ in sides.values():
        compile_()
    wall: dict[str, list[float]] = {s: [] for s in sides}
    cpu: dict[str, list[float]] = {s: [] for s in sides}
    loads = []
    for r in range(repeats):
        for side, (_, run) in sides.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            run(r + 1)
            wall[side].append(time.perf_counter() - start)
            cpu[side].append(time.process_time() - start_cpu)
        loads.append(os.getloadavg()[0])
        print(f"round {r}: " + "  ".join(f"{s} {wall[s][-1]:.2f} s (CPU {cpu[s][-1]:.2f} s)" for s in sides)
              + f"  load {loads[-1]:.1f}", flush=True)
    return {"wall_s": wall, "cpu_s": cpu, "loads": loads}


def fresh(script: str, sides: tuple[str, ...], repeats: int, cache: str | None, child_args: list[str]) -> dict:
    """Each run in a new process (`script --child SIDE *child_args`), sides alternating, JAX's compilation cache in
    `cache` (both sides) or none; -> {"train_s", "compile_s", "process_s": side -> seconds a round, "loads"}."""
    out: dict[str, dict[str, list[float]]] = {s: {"train_s": [], "compile_s": [], "process_s": []} for s in sides}
    loads = []
    for r in range(repeats):
        for side in sides:
            with tempfile.TemporaryDirectory() as cold:
                env = dict(os.environ, FRAGC_CACHE_DIR=cache or cold)
                if side != "fragc":  # the reference on XLA's own CPU threads, as its users run it (without fragc)
                    env = {k: v for k, v in env.items() if k not in ("PJRT_NPROC", "NPROC")} | {"FRAGC_CPU_THREADS": "xla"}
                if cache:
                    env["JAX_COMPILATION_CACHE_DIR"] = cache
                start = time.perf_counter()
                proc = subprocess.run([sys.executable, script, "--child", side, *child_args], capture_output=True,
                                      text=True, env=env)
                process_s = time.perf_counter() - start
            if proc.returncode:
                raise SystemExit(f"{side} failed:\n{proc.stderr[-3000:]}")
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            for key in ("train_s", "compile_s"):
                out[side][key].append(got[key])
            out[side]["process_s"].append(process_s)
        loads.append(os.getloadavg()[0])
        print(f"round {r}: " + "  ".join(f"{s} train {out[s]['train_s'][-1]:.2f} s, process "
                                          f"{out[s]['process_s'][-1]:.2f} s" for s in sides)
              + f"  load {loads[-1]:.1f}", flush=True)
    return {**{k: {s: out[s][k] for s in sides} for k in ("train_s", "compile_s", "process_s")}, "loads": loads}


def timed_child(compile_: Callable[[], None], run: Callable[[], None]) -> None:
    """A fresh process's side: `compile_()`, then `run()` timed; prints {"compile_s", "train_s"} as JSON."""
    start = time.perf_counter()
    compile_()
    compiled = time.perf_counter()
    run()
    print(json.dumps({"compile_s": compiled - start, "train_s": time.perf_counter() - compiled}))


@contextlib.contextmanager
def spinning(n: int) -> Iterator[None]:
    """`n` processes spinning on a core each, for the block."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in spinners:
            p.kill()


def ratios(times: dict[str, list[float]], reference: str) -> dict:
    """The reference's time / fragc's: the ratio of medians, each round's, and the medians."""
    return {"median_ratio": statistics.median(times[reference]) / statistics.median(times["fragc"]),
            "round_ratios": [p / f for p, f in zip(times[reference], times["fragc"])],
            "medians_s": {s: statistics.median(v) for s, v in times.items()}}


def summary(raw: dict, mode: str, baseline: str, label: str, title: str, out: str, name: str, **facts) -> dict:
    """Ratios of `raw` (steady: wall and CPU time; fresh: training and process time) of the side `baseline` to
    fragc's, printed under `title` with `label` naming the baseline, and written with `facts` to `out`/`name`.json;
    -> the result."""
    measures = ("wall_s", "cpu_s") if mode == "steady" else ("train_s", "process_s")
    result = {"mode": mode, **facts, "raw": raw, "load_range": [min(raw["loads"]), max(raw["loads"])],
              **{m: ratios(raw[m], baseline) for m in measures}}
    print(f"\n{title}, load {result['load_range'][0]:.1f}-{result['load_range'][1]:.1f}")
    for m in measures:
        r = result[m]
        print(f"  {m:10} {label} {r['medians_s'][baseline]:.2f} s, fragc {r['medians_s']['fragc']:.2f} s: "
              f"ratio {r['median_ratio']:.3f} (rounds {min(r['round_ratios']):.3f}-{max(r['round_ratios']):.3f})")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(result, f, indent=1)
    return result


def jitted_side(train: Callable, argument: Callable[[int], object]) -> Side:
    """A reference's side: `train` (jitted) called on `argument(seed)`, waited for; compiled by a first call."""
    import jax

    def run(seed: int) -> None:
        jax.block_until_ready(train(argument(seed)))

    return lambda: run(0), run


def fragc_side(build: Callable[[], object], iterations: int) -> Side:
    """fragc's side: `build()` -> its Program (compiled, then run once, as a run compiles on first use); each run
    trains `iterations` from `prog.init(seed)`."""
    import jax

    holder = {}

    def compile_() -> None:
        holder["prog"] = prog = build()
        prog.run(prog.init(0), iterations)

    def run(seed: int) -> None:
        prog = holder["prog"]
        jax.block_until_ready(prog.run(prog.init(seed), iterations)[0])

    return compile_, run
