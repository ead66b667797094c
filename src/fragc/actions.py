"""Periodic actions on the training driver (`Program.run(state, n, actions)`, `fragc.train(..., actions=)`).

Subclass `Action` and override the hooks you need; src/fragc/runtime/actions.py says when each is called.

    class StopWhenSolved(fragc.actions.Action):
        def on_start(self, run): self.run = run
        def wants_stop(self): return self.run.last_return >= 475
"""

from fragc.runtime.actions import Action, Every, OnMetrics, Run, StopAtReturn
from fragc.runtime.divergence import CheckFinite
from fragc.runtime.stopping import StopOnSignal
from fragc.training import SaveCheckpoints, ShowProgress, WriteMetrics

__all__ = ["Action", "Run", "Every", "OnMetrics", "StopAtReturn", "CheckFinite", "StopOnSignal", "SaveCheckpoints",
           "WriteMetrics", "ShowProgress"]
