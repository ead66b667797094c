"""What `fragc.compile` is asked for, as one value: `CompileOptions` (and its `SearchOptions` for `policy="auto"`).

`fragc.compile(algo, policy=..., devices=..., ...)` builds one from its keyword arguments; `run_passes` and
`build` (src/fragc/compiler.py) and the placement search (src/fragc/search/) take it, each reading what concerns it. The
search compiles each candidate with `dataclasses.replace(options, policy=..., iterations_per_dispatch=...)`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Sequence

from fragc.ir.errors import FragcError
from fragc.passes.policy import Population


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """How `policy="auto"` searches the placement (src/fragc/search/, docs/auto.md)."""

    budget: float = 60.0
    """Seconds for the whole search, after which candidates are no longer timed."""
    top: int = 3
    """How many of the best predicted candidates to compile and time."""
    candidates: Sequence[Any] | None = None
    """The space (`fragc.search.Candidate`s; default `default_candidates`)."""
    cache: bool = True
    """Read and write the decision cached on disk (the machine constants are cached whatever this says)."""
    memory_limit: int | None | str = "device"
    """Bytes per device a candidate may use; "device": the device's own limit where it reports one (none on CPU)."""
    run_iterations: int | None = None
    """The run's length, which caps the iterations per dispatch searched."""
    log: Callable[[str], None] | None = None
    """Where the search says what it does, a line at a time (default: nowhere)."""
    timed_iterations: int = 16
    """Each timed candidate runs at least this many iterations a round (whole dispatches)."""
    repeats: int = 3
    """Rounds of timing, alternating between the candidates (one when only one is timed)."""
    margin: float | None = None
    """A candidate predicted more than this many times slower than the best is not timed (None: `search.MARGIN`)."""
    settle: float = 0.1
    """No more rounds once every other candidate's fastest round is over 1 + settle times the leader's slowest."""
    machine: Any = None
    """The cost model's constants (`runtime.cost.Machine`; default: measured once per device kind and count)."""


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """Everything `fragc.compile` takes besides the algorithm (its docstring says what each means)."""

    policy: Any = "single"
    """A built-in policy's name, a `Policy`, a `population(...)`, or "auto"."""
    devices: int | Sequence[Any] | None = None
    """A count, or the devices themselves (default: one for `single` and its populations, else all)."""
    mesh: Any = None
    """A `jax.sharding.Mesh` whose devices to use, instead of `devices`."""
    iterations_per_dispatch: int | None = None
    """Iterations one dispatch runs; None: the algorithm's `iterations_per_dispatch` where it has one (alphazero's 1
    on the CPU), else 16 (`compiler.dispatch_default`)."""
    transfers: str = "auto"
    env_groups: int | None = None
    env_workers: int | None = None
    print_after_all: bool = False
    dump_dir: str | None = None
    printer: Callable[[str], None] = print
    search: SearchOptions = SearchOptions()
    env_fleet: str | None = None
    """Remote environment workers for host environments (`ray:N[xE]`, docs/distributed.md), instead of the
    policy's own."""


def search_seeds(policy: Any) -> int | None:
    """None unless `policy` asks for the placement search: 0 for "auto", S for population("auto", S)."""
    if isinstance(policy, str) and policy.replace(" ", "") == "auto":
        return 0
    if isinstance(policy, Population) and policy.base == "auto":
        if not isinstance(policy.seeds, int):
            raise FragcError(f"population('auto', S) searches the placement of S seeds, a count; it got the seeds "
                             f"{list(policy.seeds)}: pass their count, or a base policy such as single")
        if policy.seeds < 1:
            raise FragcError(f"population('auto', S) needs a seed count S >= 1, got {policy.seeds}")
        return policy.seeds
    if isinstance(policy, str) and (m := re.fullmatch(r"population\(auto,(-?\d+)\)", policy.replace(" ", ""))):
        if int(m.group(1)) < 1:
            raise FragcError(f"{policy}: population('auto', S) needs a seed count S >= 1, got {m.group(1)}")
        return int(m.group(1))
    return None
