"""fragc.passes: pass infrastructure, the passes, and distribution policies."""

from .canonicalize import Canonicalize
from .fuse import Fuse
from .loop import Loop
from .pipeline import Pass, PassError, PipelineResult, run_pipeline
from .pipeline_pass import Pipeline
from .place import Place
from .policy import (
    BUILTIN, Policy, Population, RolePlacement, actor_learner, actor_learner_async, anakin, gspmd, population,
    resolve, single,
)
from .transfers import InsertTransfers


def default_passes(policy: Policy, iterations_per_dispatch: int) -> list[Pass]:
    """The pipeline `fragc.compile` runs for a resolved policy."""
    return [Canonicalize(), Place(policy), Pipeline(policy.staleness), InsertTransfers(), Fuse(),
            Loop(iterations_per_dispatch)]


__all__ = [
    "BUILTIN", "Canonicalize", "Fuse", "InsertTransfers", "Loop", "Pass", "PassError", "Pipeline",
    "PipelineResult", "Place", "Policy", "Population", "RolePlacement", "actor_learner", "actor_learner_async",
    "anakin", "default_passes", "gspmd", "population", "resolve", "run_pipeline", "single",
]
