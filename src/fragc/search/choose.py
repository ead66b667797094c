"""The search itself: prune, rank by the cost model, compile and time the best few, cache the choice
(src/fragc/search/__init__.py says the steps)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import time
from typing import Any, Callable, Sequence

import jax

from fragc import __version__
from fragc.compiler import build, passes_of, resolved_policy
from fragc.devices import devices as choose_devices
from fragc.ir.errors import FragcError
from fragc.ir.frontend import trace
from fragc.options import CompileOptions, SearchOptions, search_seeds
from fragc.runtime.actions import steps_per_iteration
from fragc.runtime.cost import Machine, predict, state_bytes_per_device
from fragc.runtime.program import Program
from fragc.runtime.user_cache import read_json, write_json

from .cache import algo_key, cache_folder, digest
from .candidates import Candidate, default_candidates
from .machine import default_memory_limit, machine_constants
from .report import AutoProgram, AutoReport, Row, attach

MARGIN = 1.4
"""The model's measured ranking error: in the calibration of docs/benchmarks.md (8 simulated CPU devices, PPO,
DQN, IMPALA, Regression), a placement predicted up to 1.31x slower than another was measured faster than it
(DQN's actor_learner_async against anakin), none predicted more; against the earlier run's measured times
(commit a3e294e) up to 1.39x. The search times a runner-up only when it is predicted within this factor of
the best."""

VERSION = 3
"""Of the cached decisions' key: a search that decides differently gets a new number."""


@dataclasses.dataclass
class Counters:
    """What searches did in this process (tests read it): programs compiled, and timed."""

    compiled: int = 0
    timed: int = 0


COUNTERS = Counters()


@dataclasses.dataclass
class Timed:
    """A candidate being timed: its row, its program, the state it continues from, iterations a round."""

    row: Row
    prog: Program
    state: Any
    iterations: int
    samples: list[float] = dataclasses.field(default_factory=list)  # seconds per iteration, one per round


def search(algo: Any, options: CompileOptions) -> AutoProgram:
    """The chosen, compiled `Program` of `algo`, with `prog.auto` its `AutoReport`: `options.search` says how
    to search, the rest of `options` what every candidate shares (devices, transfers, environment workers;
    environment groups unless searched); `options.policy` is "auto" or `population("auto", S)`."""
    s = options.search
    devs = _checked(options)
    seeds = search_seeds(options.policy) or 0
    memory_limit = default_memory_limit(devs) if s.memory_limit == "device" else s.memory_limit
    if memory_limit is not None and (not isinstance(memory_limit, int) or isinstance(memory_limit, bool)
                                     or memory_limit < 1):
        raise FragcError(f"auto: memory_limit must be a positive number of bytes, got {memory_limit!r}")
    start = time.perf_counter()
    traced = trace(algo)
    candidates = list(s.candidates if s.candidates is not None else default_candidates(
        len(devs), any(f.host_steps for f in traced.fragments.values()), s.run_iterations, seeds,
        options.env_groups))
    if not candidates:
        raise FragcError("auto: the candidate space is empty")
    if not all(isinstance(c, Candidate) for c in candidates):
        raise FragcError("auto: candidates must be fragc.search.Candidate values")
    kind = f"{devs[0].platform}:{devs[0].device_kind}"
    key = {"algo": algo_key(algo), "device_kind": kind, "devices": len(devs), "fragc": __version__,
           "space": [c.label for c in candidates], "top": s.top, "memory_limit": memory_limit,
           "transfers": options.transfers, "env_workers": options.env_workers, "search": VERSION}
    path = os.path.join(cache_folder(), f"choice-{digest(key)}.json")
    if s.cache and (saved := read_json(path)) and saved.get("key") == json.loads(json.dumps(key, default=str)):
        report = AutoReport.from_json(saved["report"])
        report.cached, report.cache_file = True, path
        prog = build(algo, candidate_options(options, report.chosen, devs))
        report.search_s = time.perf_counter() - start
        return attach(prog, report)
    # `cache` is the decision's: the machine constants are read from their own cache whatever it says
    rows, machine = rank(algo, devs, candidates, memory_limit, options=options, machine=s.machine, traced=traced)
    live = sorted((r for r in rows if not r.pruned), key=lambda r: r.predicted_s)
    if not live:
        reasons = "; ".join(sorted({r.pruned for r in rows}))[:400]
        raise FragcError(f"auto: no candidate can run on {len(devs)} devices: {reasons}")
    say = s.log or (lambda line: None)
    say(f"auto: {len(rows)} candidates, {len(live)} can run, ranked in {time.perf_counter() - start:.1f} s")
    timed, compiled, out_of_budget = _compile_best(algo, options, devs, live, memory_limit, start, say)
    out_of_budget = _time_alternately(timed, s, start) or out_of_budget
    best = _note_untimed(live, timed, out_of_budget)
    report = AutoReport(best.row.candidate, rows, time.perf_counter() - start, len(devs), kind,
                        steps_per_iteration(algo), float(s.budget), out_of_budget, False, path if s.cache else None,
                        compiled, dataclasses.asdict(machine))
    if s.cache:
        write_json(path, {"key": key, "report": report.to_json()})
    return attach(best.prog, report)


def _checked(options: CompileOptions) -> list[Any]:
    """The search's devices, once its options are found sound."""
    s, devices = options.search, options.devices
    if options.mesh is not None:
        raise FragcError("compile: policy='auto' takes devices, not a mesh")
    if jax.process_count() > 1:
        raise FragcError("auto: the placement search runs in one process; search there (fragc run ... --policy auto "
                         "--explain) and pass the chosen policy to the multi-process run")
    if not isinstance(s.budget, (int, float)) or isinstance(s.budget, bool) or not s.budget > 0:
        raise FragcError(f"auto: the search budget must be a positive number of seconds, got {s.budget!r}")
    if not isinstance(s.top, int) or isinstance(s.top, bool) or s.top < 1:
        raise FragcError(f"auto: top must be a positive int, got {s.top!r}")
    return choose_devices(devices) if devices is None or isinstance(devices, int) else list(devices)


def candidate_options(options: CompileOptions, c: Candidate, devs: Sequence[Any]) -> CompileOptions:
    """What the search compiles candidate `c` with: the user's options, its placement, no printing."""
    return dataclasses.replace(options, policy=c.policy_arg(), devices=list(devs), mesh=None,
                               iterations_per_dispatch=c.k, env_groups=c.env_groups, print_after_all=False,
                               dump_dir=None)


def rank(algo: Any, devs: Sequence[Any], candidates: Sequence[Candidate], memory_limit: int | None = None, *,
         options: CompileOptions = CompileOptions(), machine: Machine | None = None, cache: bool = True,
         traced: Any = None) -> tuple[list[Row], Machine]:
    """The search's first half, no XLA compilation: each candidate's row, pruned (the passes refuse it, its
    state does not fit `memory_limit` bytes per device) or predicted (`runtime.cost.predict`)."""
    rows = [Row(c) for c in candidates]
    traced = traced or trace(algo)  # once for the whole search
    modules: dict[tuple, Any] = {}  # the passes of each (policy, environment groups): one module serves every k
    for row in rows:
        c = row.candidate
        placement = (c.policy, c.env_groups, c.seeds)
        if placement not in modules:
            try:
                opts = candidate_options(options, c, devs)
                modules[placement] = passes_of(traced, resolved_policy(opts, len(devs)), opts, devs).final
            except FragcError as err:
                modules[placement] = str(err)
        module = modules[placement]
        if isinstance(module, str):
            row.pruned = module
            continue
        row.memory_bytes = state_bytes_per_device(module, devs)
        if memory_limit is not None and row.memory_bytes > memory_limit:
            row.pruned = f"state needs {_mib(row.memory_bytes)} per device, over the limit {_mib(memory_limit)}"
    sizes = sorted({len(m.devices) for module in modules.values() if not isinstance(module, str)
                    for m in module.meshes} | {1})
    machine = machine or machine_constants(devs, sizes, cache=cache)
    for row in rows:
        if not row.pruned:
            c = row.candidate
            row.terms = predict(modules[(c.policy, c.env_groups, c.seeds)], machine, c.k)
            row.predicted_s = row.terms["total"]
    return rows, machine


def _compile_best(algo: Any, options: CompileOptions, devs: list[Any], live: list[Row], memory_limit: int | None,
                  start: float, say: Callable[[str], None]) -> tuple[list[Timed], int, bool]:
    """Compile the best predicted few (one k per placement, within the margin and the budget), warmed up ->
    (what will be timed, how many programs were compiled, whether the budget ran out)."""
    s = options.search
    margin = s.margin if s.margin is not None else MARGIN
    timed: list[Timed] = []
    compiled = 0
    placements: set = set()
    first_state = None
    for row in live:
        c = row.candidate
        if len(timed) >= s.top:
            break
        if (c.policy, c.env_groups) in placements:
            row.note = "not timed: a better k of this placement is"
            continue
        if timed and row.predicted_s > margin * live[0].predicted_s:
            row.note = f"not timed: predicted over {margin:g}x the best"
            continue
        if time.perf_counter() - start > s.budget and timed:
            row.note = "not timed: out of budget"
            return timed, compiled, True
        placements.add((c.policy, c.env_groups))
        try:
            prog = build(algo, candidate_options(options, c, devs))
        except FragcError as err:
            row.pruned = str(err)
            continue
        compiled += 1
        COUNTERS.compiled += 1
        row.memory_bytes = max((sum(m.values()) for m in prog.memory().values()), default=0) or row.memory_bytes
        if memory_limit is not None and row.memory_bytes > memory_limit:
            row.pruned = (f"XLA's memory analysis: {_mib(row.memory_bytes)} per device, over the limit "
                          f"{_mib(memory_limit)}")
            continue
        try:  # the first program's initial state, placed: one init program compiled per search, not per candidate
            state = prog.init(0) if first_state is None else prog.place_state(first_state)
        except FragcError:
            state = prog.init(0)
        first_state = state if first_state is None else first_state
        state, _ = prog.run(state, 1)  # warm-up: the first dispatch, transfers
        jax.block_until_ready(state)
        timed.append(Timed(row, prog, state, c.k * max(1, math.ceil(s.timed_iterations / c.k))))
        say(f"auto: compiled {c.label} ({prog.compile_seconds:.1f} s; {time.perf_counter() - start:.1f} s in)")
    if not timed:  # nothing compiled fits: say so
        raise FragcError("auto: no candidate fits: " + "; ".join(r.pruned for r in live[:3]))
    return timed, compiled, False


def _time_alternately(timed: list[Timed], s: SearchOptions, start: float) -> bool:
    """Rounds of each candidate's iterations, alternating, until the choice is settled, the rounds are done or
    the budget runs out (-> whether it did); each row's measured time is the median of its rounds."""
    out_of_budget = False
    for r in range(s.repeats if len(timed) > 1 else 1):
        if r > 0 and decided({id(t): t.samples for t in timed}, s.settle):
            break
        if r > 0 and time.perf_counter() - start > s.budget:
            out_of_budget = True
            break
        for t in timed:
            t0 = time.perf_counter()
            t.state, _ = t.prog.run(t.state, t.iterations)
            jax.block_until_ready(t.state)
            t.samples.append((time.perf_counter() - t0) / t.iterations)
            COUNTERS.timed += 1
    for t in timed:
        t.row.measured_s = statistics.median(t.samples) if t.samples else None
    return out_of_budget


def _note_untimed(live: list[Row], timed: list[Timed], out_of_budget: bool) -> Timed:
    """Say why each runnable row was not timed -> the fastest timed candidate."""
    timed_rows = {id(t.row) for t in timed}
    for row in live:
        if id(row) not in timed_rows and not row.note and not row.pruned:
            row.note = "not timed" + (": out of budget" if out_of_budget else "")
    return min(timed, key=lambda t: t.row.measured_s or math.inf)


def decided(samples: dict[int, list[float]], settle: float) -> bool:
    """Whether more rounds cannot change the choice by more than `settle`: every other candidate's fastest
    sample is over (1 + settle) x the leader's slowest."""
    runs = [v for v in samples.values() if v]
    if len(runs) < 2:
        return True
    leader = min(runs, key=min)
    return all(min(v) > (1 + settle) * max(leader) for v in runs if v is not leader)


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB"
