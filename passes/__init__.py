"""fragc.passes: pass infrastructure, the passes, and distribution policies."""

from .canonicalize import Canonicalize
from .loop import Loop
from .pipeline import Pass, PassError, PipelineResult, run_pipeline
from .place import Place
from .policy import BUILTIN, Policy, RolePlacement, resolve, single

__all__ = [
    "BUILTIN", "Canonicalize", "Loop", "Pass", "PassError", "PipelineResult", "Place", "Policy", "RolePlacement",
    "resolve", "run_pipeline", "single",
]
