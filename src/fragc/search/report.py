"""What the placement search reports: a row per candidate (predicted and measured time, or why pruned), the
table of them, and the chosen program carrying it (`prog.auto`)."""

from __future__ import annotations

import dataclasses
import math

from fragc.runtime.program import Program

from .candidates import Candidate


@dataclasses.dataclass
class Row:
    """A candidate's line in the table."""

    candidate: Candidate
    predicted_s: float | None = None  # seconds per iteration, the cost model's
    measured_s: float | None = None  # seconds per iteration, median of the timed repeats
    pruned: str = ""  # why it cannot run
    note: str = ""  # e.g. "not timed: out of budget"
    memory_bytes: int | None = None  # per device: the state's (estimate), or XLA's analysis once compiled
    terms: dict = dataclasses.field(default_factory=dict)  # the model's terms, seconds per iteration

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["candidate"] = dataclasses.asdict(self.candidate)
        return d

    @staticmethod
    def from_json(d: dict) -> "Row":
        return Row(**{**d, "candidate": Candidate(**d["candidate"])})


@dataclasses.dataclass
class AutoReport:
    """What the search did: `prog.auto` of a program compiled with `policy="auto"`."""

    chosen: Candidate
    rows: list[Row]
    search_s: float
    devices: int
    device_kind: str
    steps_per_iteration: int = 0
    budget_s: float = 60.0
    out_of_budget: bool = False
    cached: bool = False
    cache_file: str | None = None
    compiled: int = 0  # programs compiled (and timed) by the search
    constants: dict = dataclasses.field(default_factory=dict)

    def summary(self) -> str:
        how = ("cached decision" if self.cached else
               f"{len(self.rows)} candidates in {self.search_s:.1f} s"
               + (", out of budget" if self.out_of_budget else ""))
        return f"auto: chose {self.chosen.label} from {how}"

    def table(self) -> str:
        """The ranked table: predicted and measured time per iteration (and env-steps/s), or why pruned."""
        steps = self.steps_per_iteration
        ranked = sorted(self.rows, key=rank_key)
        lines = [f"{'':2}{'candidate':40}{'predicted ms/it':>16}{'measured ms/it':>16}{'env-steps/s':>13}"
                 f"{'MiB/device':>11}  note"]
        for r in ranked:
            mark = "*" if r.candidate == self.chosen else ""
            pred = f"{r.predicted_s * 1e3:.2f}" if r.predicted_s is not None else "-"
            meas = f"{r.measured_s * 1e3:.2f}" if r.measured_s is not None else "-"
            sps = f"{steps / r.measured_s:,.0f}" if (r.measured_s and steps) else "-"
            mem = f"{r.memory_bytes / 2**20:.2f}" if r.memory_bytes is not None else "-"
            why = f"pruned: {r.pruned}" if r.pruned else r.note
            lines.append(f"{mark:2}{r.candidate.label:40}{pred:>16}{meas:>16}{sps:>13}{mem:>11}  {why}")
        lines.append(self.summary())
        return "\n".join(lines)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["chosen"] = dataclasses.asdict(self.chosen)
        d["rows"] = [r.to_json() for r in self.rows]
        return d

    @staticmethod
    def from_json(d: dict) -> "AutoReport":
        return AutoReport(**{**d, "chosen": Candidate(**d["chosen"]), "rows": [Row.from_json(r) for r in d["rows"]]})


def rank_key(r: Row) -> tuple:
    if r.pruned:
        return (2, 0.0, 0.0)
    if r.measured_s is not None:
        return (0, r.measured_s, 0.0)
    return (1, r.predicted_s if r.predicted_s is not None else math.inf, 0.0)


class AutoProgram(Program):
    """A `Program` chosen by the search: `auto` holds its report, and `ir()` says so in its header."""

    auto: AutoReport

    def ir(self, after: str | None = None) -> str:
        text = super().ir(after)
        first, _, rest = text.partition("\n")
        return f"{first}\n// {self.auto.summary()}\n{rest}"


def attach(prog: Program, report: AutoReport) -> AutoProgram:
    """The chosen program, with its report in `prog.auto` and a line about it in its IR's header."""
    prog.__class__ = AutoProgram
    prog.auto = report
    return prog
