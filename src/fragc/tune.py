"""Hyperparameter search with Optuna over populations (`fragc tune`, src/fragc/cli/tune.py; docs/tuning.md).

Optuna proposes trials; fragc runs `batch` of them at once as one population program (a member per trial and
seed, its hyperparameters traced values in the state: src/fragc/ir/sweep.py), so a batch of trials costs about one run. The
program is compiled once: a trial's values are written into its members' state (`SweepState.hyper`) together with a
fresh initial state, the same as `Program.init` makes for those values.

Each member slot holds one trial. After each dispatch every running trial reports its metric's mean over the
dispatch to Optuna at its own iteration count (`trial.report`), and asks the pruner. A trial that has run its
`iterations` is told its score: the mean of the metric over its last tenth of iterations and over its seeds
(`stats.final_window`, as `fragc sweep` scores). A trial that finishes or is pruned frees its slot, which takes the
next trial Optuna proposes, with a fresh state, while the other slots go on: the population keeps running full.
Once no trial is left to ask for, a freed slot stays frozen (it keeps computing, its results unused: a compiled
population cannot shrink) until the last trials end.

Optuna is an optional extra (`pip install 'fragc[tune]'`), imported when a study is opened.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import warnings
from typing import Any, Sequence, TextIO

import jax
import jax.numpy as jnp
import numpy as np

from fragc.compiler import run_passes, warn_per_replica
from fragc.ir.errors import FragcError
from fragc.ir.sweep import check_grid, swept
from fragc.options import CompileOptions
from fragc.passes.policy import population
from fragc.runtime.program import Program
from fragc.sinks import stats

JOURNAL = "journal.log"
"""The study's file in its folder: Optuna's JournalStorage with a file backend (no SQL database needed)."""


def optuna_module() -> Any:
    """optuna, or one line saying how to install it."""
    try:
        import optuna
    except ImportError:
        raise FragcError("fragc tune needs optuna: pip install 'fragc[tune]'") from None
    return optuna


# ---------------------------------------------------------------- the search space


@dataclasses.dataclass(frozen=True)
class Range:
    """A config field searched between `low` and `high` (both included), log-uniformly with `log`; a whole
    number for an int field."""

    field: str
    low: float
    high: float
    log: bool = False
    integer: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or self.low >= self.high:
            raise FragcError(f"tune: {self.field}: a range is LOW..HIGH with LOW < HIGH, both finite; got "
                             f"{self.low:g}..{self.high:g}")
        if self.log and self.low <= 0:
            raise FragcError(f"tune: {self.field}: a log range needs LOW > 0, got {self.text()}")

    def text(self) -> str:
        """As the command line writes it: `log:1e-05..0.01` or `0.9..0.999`."""
        return f"{'log:' if self.log else ''}{self.low:g}..{self.high:g}"

    def suggest(self, trial: Any) -> float | int:
        if self.integer:
            return trial.suggest_int(self.field, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.field, self.low, self.high, log=self.log)


def parse_range(field: str, text: str, integer: bool = False) -> Range:
    """`LOW..HIGH` or `log:LOW..HIGH` -> a Range of `field` (a FragcError naming the syntax otherwise)."""
    log = text.startswith("log:")
    body = text[4:] if log else text
    parts = body.split("..")
    try:
        if len(parts) != 2:
            raise ValueError
        low, high = (int(p) if integer else float(p) for p in parts)
    except ValueError:
        kind = "whole numbers" if integer else "numbers"
        raise FragcError(f"tune: {field}: expected a value, LOW..HIGH or log:LOW..HIGH ({kind}), got {text!r}") from None
    return Range(field, low, high, log, integer)


FIELD_RANGES = {
    "gamma": (0.9, 0.999, False), "gae_lambda": (0.8, 0.99, False), "td_lambda": (0.5, 0.99, False),
    "clip_eps": (0.1, 0.4, False), "ent_coef": (0.0, 0.05, False), "vf_coef": (0.25, 1.0, False),
    "max_grad_norm": (0.1, 5.0, True), "eps_end": (0.01, 0.2, False), "rho_bar": (0.5, 2.0, False),
    "tau": (0.001, 0.05, True),
}
"""The default range of a field, by name: (low, high, log). A learning rate (`lr`, `q_lr`, ...) is searched
log-uniformly from a tenth to ten times the algorithm's default."""

DEFAULT_SPACES = {
    "ppo": ("lr", "gamma", "gae_lambda", "clip_eps", "ent_coef", "vf_coef", "max_grad_norm"),
    "ppo_rnn": ("lr", "gamma", "gae_lambda", "clip_eps", "ent_coef", "vf_coef", "max_grad_norm"),
    "ppo_continuous": ("lr", "gamma", "gae_lambda", "clip_eps", "vf_coef", "max_grad_norm"),
    "a2c": ("lr", "gamma", "gae_lambda", "ent_coef", "vf_coef"),
    "impala": ("lr", "gamma", "ent_coef", "rho_bar"),
    "dqn": ("lr", "gamma", "eps_end"),
    "pqn": ("lr", "gamma", "td_lambda"),
    "sac": ("q_lr", "policy_lr", "gamma", "tau"),
}
"""A built-in algorithm's search space when the command line gives none: fields each program reads as a number
(tests/test_tune.py traces every one, with -m slow)."""


def default_space(name: str, algo: Any) -> list[Range]:
    """The search space of built-in algorithm `name` (`DEFAULT_SPACES`), around `algo`'s config."""
    if name not in DEFAULT_SPACES:
        raise FragcError(f"tune: {name} has no default search space: give one, e.g. --lr log:1e-5..1e-2 "
                         f"--gamma 0.9..0.999 (docs/tuning.md)")
    space = []
    for field in DEFAULT_SPACES[name]:
        if field.endswith("lr"):
            base = getattr(algo.config, field)
            space.append(Range(field, base / 10, base * 10, log=True))
        else:
            space.append(Range(field, *FIELD_RANGES[field]))
    return space


def check_space(algo: Any, space: Sequence[Range]) -> None:
    """Every searched field is a number of `algo`'s config, and both ends of its range make a valid config (one
    line naming the value otherwise); a field that sets a shape is refused when the population is traced."""
    if not space:
        raise FragcError("tune: nothing to search: give a field a range (--lr log:1e-5..1e-2)")
    fields = [r.field for r in space]
    if len(set(fields)) != len(fields):
        raise FragcError(f"tune: a field is searched twice: {fields}")
    for r in space:
        try:
            check_grid(algo, ((r.field, (r.low, r.high)),))
        except FragcError as err:
            raise FragcError(f"tune: --{r.field.replace('_', '-')} {r.text()}: {str(err).removeprefix('sweep: ')}") \
                from None
        if isinstance(getattr(algo.config, r.field), int) != r.integer:
            raise FragcError(f"tune: {r.field} is {type(getattr(algo.config, r.field)).__name__}: its range must be "
                             f"of {'whole numbers' if not r.integer else 'numbers'}")


# ---------------------------------------------------------------- the population


class TrialPopulation:
    """One compiled population of `slots` x `len(seeds)` members over the fields of `space`, and the fresh
    member states that trials start from. Member `slot * len(seeds) + j` runs seed `seeds[j]`. `exact`: the
    members one after another, each bit for bit its single run (`population(..., exact=True)`), not vectorised.
    `metric`, if given, must be one the iteration reports: checked once the algorithm is traced, before XLA compiles
    anything."""

    def __init__(self, algo: Any, space: Sequence[Range], slots: int, seeds: Sequence[int], devices: int | None,
                 iterations_per_dispatch: int, exact: bool = False, metric: str | None = None):
        self.fields, self.seeds, self.slots = [r.field for r in space], list(seeds), slots
        self.count = slots * len(self.seeds)
        defaults = {f: [getattr(algo.config, f)] for f in self.fields}
        policy = population("single", self.count, exact=exact, **defaults)  # the values are the state's: set per trial
        # `compiler.build` of a population, in two steps: the metric is checked between tracing and compiling
        options = CompileOptions(policy, devices, iterations_per_dispatch=iterations_per_dispatch)
        pipeline, devs, resolved = run_passes(algo, options)
        self.metrics = pipeline.final.metric_names()
        if metric is not None:
            self.check_metric(metric)
        warn_per_replica(pipeline.final)
        self.prog = Program(algo, pipeline, devs, resolved)
        template = self.prog.init(0)
        self.tree = jax.tree.structure(template)
        self.hyper = {f: np.array(template.hyper[f]) for f in self.fields}  # a copy to write into
        self.member_seeds = np.asarray(self.seeds * slots, np.uint32)
        self._init = jax.jit(_member_init(swept(algo, self.fields)))
        self.state = template

    def start(self, starting: dict[int, dict[str, float]]) -> None:
        """The members of each slot of `starting` (slot -> values) start afresh with its values (their initial
        state made with them); the other members go on."""
        fresh = np.zeros(self.count, bool)
        for slot, values in starting.items():
            members = slice(slot * len(self.seeds), (slot + 1) * len(self.seeds))
            for f in self.fields:
                self.hyper[f][members] = values[f]
            fresh[members] = True
        made = self._init(self.member_seeds, {f: jnp.asarray(v) for f, v in self.hyper.items()},
                          jnp.arange(self.count, dtype=jnp.int32))
        made = jax.tree.unflatten(self.tree, jax.tree.leaves(made))  # the static fields the program traced
        self.state = self.prog.place_state(jax.tree.map(lambda new, old: _where(fresh, new, old), made, self.state))

    def check_metric(self, metric: str) -> None:
        """`metric` is one the iteration reports (else one line naming them, and the closest)."""
        if metric not in self.metrics:
            close = difflib.get_close_matches(metric, self.metrics, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise FragcError(f"tune: the algorithm reports no metric '{metric}'{hint}; it reports "
                             f"{', '.join(self.metrics) or 'none'}")

    def run(self, iterations: int, metric: str) -> np.ndarray:
        """Run `iterations` iterations -> the metric, [members, iterations] (each member's mean per iteration)."""
        self.check_metric(metric)
        self.state, history = self.prog.run(self.state, iterations)
        rows = np.asarray(history[metric], np.float64)
        return rows.reshape(rows.shape[0], rows.shape[1], -1).mean(axis=2)


def _member_init(algo: Any) -> Any:
    """Every member's initial state for its seed and values, members in turn (`lax.map`: Program's init says why)."""
    def init(seeds: jax.Array, hyper: dict, members: jax.Array) -> Any:
        return jax.lax.map(lambda a: algo.init(jax.random.key(a[0]), a[1], a[2]), (seeds, hyper, members))
    return init


def _where(mask: np.ndarray, new: jax.Array, old: jax.Array) -> jax.Array:
    """`new` for the members in `mask`, `old` for the others (PRNG keys as their data)."""
    if jax.dtypes.issubdtype(new.dtype, jax.dtypes.prng_key):
        return jax.random.wrap_key_data(_where(mask, jax.random.key_data(new), jax.random.key_data(old)),
                                        impl=jax.random.key_impl(new))
    return jnp.where(jnp.asarray(mask).reshape((-1,) + (1,) * (new.ndim - 1)), new, old)


# ---------------------------------------------------------------- the study


def open_study(directory: str | None, sampler: str = "tpe", pruner: str = "none", seed: int = 0,
               setup: dict | None = None, name: str = "fragc-tune") -> Any:
    """An Optuna study (maximising), stored in `directory` (JournalStorage, file backend) so that a rerun
    continues it; in memory without a directory. `setup` (the algorithm, config, space, iterations, seeds,
    metric) is stored with a new study and must match an existing one. The sampler's seed is `seed` plus the
    trials already stored, so a continued study does not draw its first trials again."""
    optuna = optuna_module()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage, journal = None, None if directory is None else os.path.join(directory, JOURNAL)
    if journal is not None and os.path.exists(journal):
        check_journal(journal)
    try:
        if journal is not None:
            storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(journal))
        stored = _stored_trials(optuna, storage, name)
        study = optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True,
                                    sampler=make_sampler(optuna, sampler, seed + stored),
                                    pruner=make_pruner(optuna, pruner))
    except DAMAGED as err:
        if journal is None:
            raise
        raise damaged_journal(journal, _why(err)) from None
    if setup is not None:
        _check_setup(study, setup, directory)
    _retry_interrupted(optuna, study)
    return study


DAMAGED = (ValueError, KeyError, TypeError, IndexError, AttributeError, AssertionError)
"""What Optuna raises replaying a journal that `check_journal` lets by but that is not one it wrote: operations
it does not know or that contradict each other (AssertionError, KeyError, TypeError)."""


def check_journal(journal: str) -> None:
    """`journal` is whole: text, each line a JSON operation, the last one ended (one line naming the file and the
    damage otherwise). Optuna itself skips a last line cut off (another process may be writing it) and appends
    its next operation to it, which damages the line for good; one study is written by one `fragc tune`."""
    with open(journal, "rb") as f:
        data = f.read()
    try:
        *lines, rest = data.decode("utf-8").split("\n")  # as Optuna reads it
    except UnicodeDecodeError as err:
        raise damaged_journal(journal, f"it is not text: {_why(err)}") from None
    if rest:
        raise damaged_journal(journal, f"its last line ({len(lines) + 1}) is cut off")
    for number, line in enumerate(lines, start=1):
        try:
            operation = json.loads(line)
        except ValueError as err:
            raise damaged_journal(journal, f"line {number} is not JSON: {_why(err)}") from None
        if not (isinstance(operation, dict) and "op_code" in operation):
            raise damaged_journal(journal, f"line {number} is not one of Optuna's operations")


def damaged_journal(journal: str, why: str) -> FragcError:
    """One line: `journal` cannot be read as a study, why, and what to do."""
    return FragcError(f"tune: '{journal}' is damaged, not a study Optuna can read ({why}); move it away to start a "
                      f"new study, or give another --study-dir")


def _why(err: BaseException) -> str:
    """An exception in a few words, on one line."""
    text = (str(err).splitlines() or [""])[0][:120]
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _stored_trials(optuna: Any, storage: Any, name: str) -> int:
    if storage is None or name not in [s.study_name for s in optuna.get_all_study_summaries(storage)]:
        return 0
    return len(optuna.load_study(study_name=name, storage=storage).trials)


def make_sampler(optuna: Any, name: str, seed: int) -> Any:
    """`tpe` (with the constant liar, since a batch's trials run together) or `random`, seeded."""
    if name == "tpe":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # constant_liar
            return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise FragcError(f"tune: unknown sampler {name!r}: tpe or random")


def make_pruner(optuna: Any, name: str) -> Any:
    """`median` (a trial below the median of finished trials at its step), `halving` (successive halving) or
    `none`."""
    pruners = {"median": optuna.pruners.MedianPruner, "halving": optuna.pruners.SuccessiveHalvingPruner,
               "none": optuna.pruners.NopPruner}
    if name not in pruners:
        raise FragcError(f"tune: unknown pruner {name!r}: median, halving or none")
    return pruners[name]()


def _check_setup(study: Any, setup: dict, directory: str | None) -> None:
    stored = study.user_attrs.get("setup")
    if stored is None:
        study.set_user_attr("setup", setup)
    elif stored != setup:
        changed = sorted(k for k in set(stored) | set(setup) if stored.get(k) != setup.get(k))
        raise FragcError(f"tune: the study in '{directory}' was made with another {', '.join(changed)}; continue it "
                         f"with the same options, or give another --study-dir")


def _retry_interrupted(optuna: Any, study: Any) -> None:
    """Trials left running by a process that ended (killed, interrupted) are failed, and asked again first."""
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(trial.params)


def finished(study: Any) -> list[Any]:
    """The study's completed and pruned trials."""
    state = optuna_module().trial.TrialState
    return [t for t in study.get_trials(deepcopy=False) if t.state in (state.COMPLETE, state.PRUNED)]


# ---------------------------------------------------------------- running trials


@dataclasses.dataclass
class Slot:
    """A trial running in the population: its members' metric rows so far, [seeds, iterations]."""

    trial: Any
    rows: np.ndarray


@dataclasses.dataclass
class TuneResult:
    """What `tune` did."""

    study: Any
    """The Optuna study (every trial, the best one)."""
    ran: int
    """Trials finished (completed or pruned) by this call."""
    dispatches: int
    """Population dispatches this call ran."""


def tune(pop: TrialPopulation, study: Any, space: Sequence[Range], trials: int, iterations: int,
         metric: str = "episode_return", log: TextIO | None = None) -> TuneResult:
    """Run the study's trials in `pop`'s slots until it has `trials` finished (completed or pruned) trials: `trials`
    is the study's total, the stored ones included. A `metric` the algorithm does not report is refused before any
    trial is asked for."""
    pop.check_metric(metric)
    left = trials - len(finished(study))
    result = TuneResult(study, 0, 0)
    slots: list[Slot | None] = [None] * pop.slots
    while True:
        left -= _fill(pop, study, space, slots, left)
        running = [s for s in slots if s is not None]
        if not running:
            return result
        n = min(pop.prog.k, min(iterations - s.rows.shape[1] for s in running))
        rows = pop.run(n, metric)
        result.dispatches += 1
        for i, slot in enumerate(slots):
            if slot is not None and _report(study, slot, rows[i * len(pop.seeds):(i + 1) * len(pop.seeds)],
                                            iterations, log):
                slots[i], result.ran = None, result.ran + 1


def _fill(pop: TrialPopulation, study: Any, space: Sequence[Range], slots: list, left: int) -> int:
    """Up to `left` new trials from Optuna in the free slots, started afresh -> how many."""
    free = [i for i, s in enumerate(slots) if s is None][:max(0, left)]
    for i in free:
        trial = study.ask()
        for r in space:
            r.suggest(trial)  # the values land in trial.params
        slots[i] = Slot(trial, np.zeros((len(pop.seeds), 0)))
    if free:
        pop.start({i: slots[i].trial.params for i in free})
    return len(free)


def _report(study: Any, slot: Slot, rows: np.ndarray, iterations: int, log: TextIO | None) -> bool:
    """A dispatch's rows ([seeds, n]) to the slot's trial: its mean to Optuna at the trial's iteration count; the
    score once it has run `iterations`, else the pruner's verdict -> whether the trial ended."""
    slot.rows = np.concatenate([slot.rows, rows], axis=1)
    done = slot.rows.shape[1]
    slot.trial.report(float(np.mean(rows)), done)
    if done >= iterations:
        study.tell(slot.trial, trial_score(slot.rows))
    elif slot.trial.should_prune():
        study.tell(slot.trial, state=optuna_module().trial.TrialState.PRUNED)
    else:
        return False
    _say(log, study.trials[slot.trial.number], done)
    return True


def trial_score(rows: np.ndarray) -> float:
    """A trial's score: over its seeds, the mean of each seed's last tenth of iterations (`stats.final_scores`)."""
    return float(np.mean(stats.final_scores(rows)))


def _say(log: TextIO | None, trial: Any, iterations: int) -> None:
    if log is None:
        return
    score = f"score {trial.value:.2f}" if _completed(trial) else f"pruned at iteration {iterations}"
    print(f"  trial {trial.number}: {params_text(trial.params)}: {score}", file=log)


def params_text(params: dict) -> str:
    return " ".join(f"{k}={v:.4g}" for k, v in params.items())


# ---------------------------------------------------------------- the report


def trials_table(study: Any) -> str:
    """The finished trials, completed ones best first, then the pruned: number, state, score, iterations run,
    values. A pruned trial has no score (Optuna keeps its last report as its value: not comparable)."""
    rows = sorted(finished(study), key=lambda t: (not _completed(t), -(t.value or 0.0) if _completed(t) else 0.0,
                                                 t.number))
    cells = [["trial", "state", "score", "iterations", "values"]]
    for t in rows:
        cells.append([str(t.number), t.state.name.lower(), f"{t.value:.2f}" if _completed(t) else "-",
                      str(max(t.intermediate_values, default=0)), params_text(t.params)])
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def _completed(trial: Any) -> bool:
    return trial.state.name == "COMPLETE"


def best(study: Any) -> Any | None:
    """The completed trial with the highest score, None before any completes."""
    done = [t for t in finished(study) if _completed(t)]
    return max(done, key=lambda t: t.value) if done else None


def summary(study: Any, result: TuneResult) -> dict:
    top = best(study)
    return {"best": None if top is None else {"trial": top.number, "score": top.value, "config": top.params},
            "trials": [{"trial": t.number, "state": t.state.name.lower(), "score": t.value if _completed(t) else None,
                        "config": t.params,
                        "iterations": max(t.intermediate_values, default=0)} for t in finished(study)],
            "ran": result.ran, "dispatches": result.dispatches}
