"""`policy="auto"`: a placement search guided by a cost model and checked by measurement (docs/auto.md).

1. enumerate candidates (candidates.py): every built-in policy (actor/learner splits of the devices), iterations
   per dispatch, environment groups for host environments, a population's base policy;
2. prune what cannot run, with the reason: the passes refuse it (`FragcError`), or its state does not fit
   the memory limit per device (choose.py, `rank`);
3. rank the rest by the cost model (`runtime.cost.predict`, with constants machine.py measures once per device
   kind and count): no XLA compilation, only the passes and the jaxprs;
4. compile and time the best few (`SearchOptions.top`), alternating, within a time budget; XLA's memory analysis
   of each compiled program prunes one over the limit; the fastest measured wins (choose.py, `search`);
5. cache the decision on disk (cache.py), keyed by the algorithm's configuration, the devices, fragc's version
   and the candidate space: the same search again compiles only the chosen program.

The search sits above the compiler (src/fragc/compiler.py), which it calls for each candidate, and below
`fragc.compile`, which calls it for `policy="auto"`. `prog.auto` is its report (report.py).
"""

from .candidates import KS, Candidate, default_candidates, group_sizes_of
from .choose import COUNTERS, MARGIN, candidate_options, decided, rank, search
from .machine import default_memory_limit, machine_constants, measure_machine
from .report import AutoProgram, AutoReport, Row

__all__ = ["KS", "MARGIN", "COUNTERS", "AutoProgram", "AutoReport", "Candidate", "Row", "candidate_options",
           "decided", "default_candidates", "default_memory_limit", "group_sizes_of", "machine_constants",
           "measure_machine", "rank", "search"]
