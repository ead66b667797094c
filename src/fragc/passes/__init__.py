"""fragc.passes: pass infrastructure, the passes, and distribution policies."""

from .canonicalize import Canonicalize
from .delays import InsertDelays
from .fuse import Fuse
from .host_loops import LowerHostLoops
from .loop import DispatchLoop
from .pipeline import Pass, PassError, PipelineResult, pass_name, run_pipeline
from .place import Place
from .policy import (
    BUILTIN, Policy, Population, RolePlacement, actor_learner, actor_learner_async, anakin, gspmd, population,
    resolve, single,
)
from .transfers import InsertTransfers


def default_passes(policy: Policy, iterations_per_dispatch: int, carrier: str = "device_put") -> list[Pass]:
    """The pipeline `fragc.compile` runs for a resolved policy; `carrier` carries the transfers."""
    return [Canonicalize(), Place(policy), InsertDelays(policy.staleness), InsertTransfers(carrier), Fuse(),
            DispatchLoop(iterations_per_dispatch), LowerHostLoops()]


__all__ = [
    "BUILTIN", "Canonicalize", "DispatchLoop", "Fuse", "InsertDelays", "InsertTransfers", "LowerHostLoops", "Pass", "PassError",
    "PipelineResult", "Place", "Policy", "Population", "RolePlacement", "actor_learner", "actor_learner_async",
    "anakin", "default_passes", "gspmd", "pass_name", "population", "resolve", "run_pipeline", "single",
]
