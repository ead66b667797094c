"""`fragc tune` (src/fragc/tune.py): each trial's score, as Optuna is told it, is its single run's; a pruned trial's
slot restarts with the next trial; a stored study continues; bad input is one line before anything is written."""

import dataclasses
import functools
import json
import re
import shlex

import jax
import numpy as np
import pytest

import fragc
from fragc.tune import DEFAULT_SPACES, Range, TrialPopulation, open_study, trials_table, tune
from toy_algos import Regression, regression_by_hand

optuna = pytest.importorskip("optuna")


@dataclasses.dataclass(frozen=True)
class FitConfig:
    lr: float = 0.1
    num_envs: int = 8


class Fit(Regression):
    """A user's algorithm to tune (tests/toy_algos.py's regression, its learning rate in `self.config`): its score
    is minus the loss, and `regression_by_hand` is its plain JAX reference. Tiny, so that the tests compile little."""

    def __init__(self, config: FitConfig = FitConfig()):
        self.num_envs, self.config = config.num_envs, config

    @property
    def lr(self):
        return self.config.lr

    def iteration(self, state):
        state, metrics = super().iteration(state)
        return state, {"score": -metrics["loss"]}


ITERATIONS, K = 20, 4
SPACE = [Range("lr", 0.01, 0.5, log=True)]
TUNE = ["tune", f"{__file__}:Fit", "--iterations", str(ITERATIONS), "--iterations-per-dispatch", str(K),
        "--batch", "2", "--lr", "log:0.01..0.5", "--metric", "score", "--sampler", "random", "--json"]
BAD = ["tune", "ppo", "--lr", "log:1e-4..1e-2", "--trials", "2"]


@functools.cache
def population() -> TrialPopulation:
    """`--exact`'s population (the CLI's test runs the vectorised one)."""
    return TrialPopulation(Fit(), SPACE, slots=2, seeds=[0], devices=None, iterations_per_dispatch=K, exact=True)


@functools.cache
def scores_by_hand(lr: float, seed: int = 0) -> tuple[float, ...]:
    """The reference: the trial's configuration run as a plain JAX loop, its score at each of 20 iterations."""
    state, scores = jax.jit(Fit().init)(jax.random.key(seed)), []
    step = jax.jit(regression_by_hand, static_argnums=1)
    for _ in range(ITERATIONS):
        state, metrics = step(state, 1, lr)
        scores.append(-float(metrics["loss"]))
    return tuple(scores)


def by_hand(lr: float, seed: int = 0) -> float:
    """A trial's score by hand: its mean score over the last 2 of 20 iterations (a tenth)."""
    return float(np.mean(scores_by_hand(lr, seed)[-2:]))


class PruneTrialZero(optuna.pruners.BasePruner):
    """Prunes trial 0 at its first report, no other."""

    def prune(self, study, trial) -> bool:
        return trial.number == 0


def test_a_pruned_trials_slot_restarts_with_the_next_trial_and_each_score_is_its_single_run():
    """3 trials in 2 slots: trial 0 is pruned after its first dispatch, and trial 2 takes its slot with a fresh
    state while trial 1 goes on; each completed trial's score is its own single run's."""
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0),
                                pruner=PruneTrialZero())
    result = tune(population(), study, SPACE, trials=3, iterations=ITERATIONS, metric="score")
    zero, one, two = study.trials
    assert zero.state.name == "PRUNED" and list(zero.intermediate_values) == [K]
    assert [t.state.name for t in (one, two)] == ["COMPLETE", "COMPLETE"]
    assert list(two.intermediate_values) == list(range(K, ITERATIONS + 1, K))
    assert result.ran == 3 and result.dispatches == 1 + ITERATIONS // K  # trial 2 ends one dispatch after trial 1
    for trial in (one, two):
        assert trial.value == pytest.approx(by_hand(trial.params["lr"]), rel=1e-5)
    assert re.search(rf"^0 +pruned +- +{K} +lr=", trials_table(study), re.M)  # no score: Optuna's is its last report


def test_a_stored_study_continues_with_its_trials_and_refuses_another_setup(capsys, tmp_path):
    from fragc.cli import main

    study_dir = str(tmp_path / "study")
    assert main([*TUNE, "--trials", "2", "--study-dir", study_dir]) == 0
    first = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert main([*TUNE, "--trials", "3", "--study-dir", study_dir]) == 0
    second = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert second["ran"] == 1 and second["trials"][:2] == first["trials"]  # the stored trials, then one more
    assert second["trials"][2]["config"] != first["trials"][0]["config"]  # the sampler went on, not from its start
    assert second["best"]["score"] == max(t["score"] for t in second["trials"])
    assert main([*TUNE, "--trials", "3", "--study-dir", study_dir, "--lr", "0.01..0.5"]) == 2
    assert re.search(r"was made with another space; continue it", capsys.readouterr().err)
    assert len(open_study(study_dir).trials) == 3


def test_tune_ends_with_the_command_that_reruns_its_best_trial_and_trials_is_the_studys_total(capsys, tmp_path,
                                                                                              monkeypatch):
    """The command printed runs the best trial's configuration (`fragc run`, checked against the plain JAX loop);
    a rerun with as many --trials as the study has runs nothing, compiles nothing, and says so in one line."""
    from fragc.cli import main

    argv = [*TUNE, "--trials", "2", "--num-envs", "8", "--study-dir", str(tmp_path / "study")]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out.splitlines()[-1])
    words = shlex.split(first["rerun"])
    options = dict(zip(words[3::2], words[4::2]))
    assert words[:3] == ["fragc", "run", f"{__file__}:Fit"] and len(words) % 2 == 1
    assert options == {"--num-envs": "8", "--lr": repr(first["best"]["config"]["lr"]), "--iterations": str(ITERATIONS),
                       "--seed": "0"}
    assert main([*words[1:], "--json"]) == 0
    rerun = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert rerun["iterations"] == ITERATIONS
    assert rerun["final_metrics"]["score"] == pytest.approx(scores_by_hand(first["best"]["config"]["lr"])[-1],
                                                             rel=1e-5)

    monkeypatch.setattr("fragc.cli.tune.TrialPopulation", None)  # nothing to run: nothing compiled
    assert main(argv) == 0
    captured = capsys.readouterr()
    again = json.loads(captured.out.splitlines()[-1])
    assert (again["ran"], again["dispatches"], again["trials"], again["rerun"]) == (0, 0, first["trials"],
                                                                                    first["rerun"])
    assert ("the study already has 2 trials (--trials is the total): nothing to run; pass --trials 4 to run 2 more"
            in captured.err.splitlines())


@pytest.mark.parametrize("argv,message", [
    (["--lr", "1e-2..1e-4"], r"tune: lr: a range is LOW..HIGH with LOW < HIGH"),
    (["--lr", "log:0..1e-2"], r"tune: lr: a log range needs LOW > 0"),
    (["--lr", "1e-4..x"], r"tune: lr: expected a value, LOW..HIGH or log:LOW..HIGH"),
    (["--lr=-1e-4..1e-2"], r"tune: --lr -0.0001..0.01: lr=-0.0001: ppo: lr must be positive"),
    (["--anneal-lr", "true..false"], r"tune: anneal_lr is bool: only numbers can be searched"),
    pytest.param(["--num-envs", "4..8"], r"uses 'num_envs' as a Python value", marks=pytest.mark.slow),  # traces PPO
    (["--lrr", "1..2"], r"ppo has no option --lrr"),
])
def test_bad_tune_input_is_one_line_before_anything_is_written(capsys, tmp_path, argv, message):
    from fragc.cli import main

    study_dir = tmp_path / "study"
    assert main([*BAD, "--study-dir", str(study_dir), *argv]) == 2  # the last --lr counts
    err = capsys.readouterr().err.strip()
    assert re.search(message, err) and len(err.splitlines()) == 1, err
    assert not study_dir.exists()


def test_without_optuna_tune_names_the_extra(capsys, tmp_path, monkeypatch):
    from fragc.cli import main

    monkeypatch.setitem(__import__("sys").modules, "optuna", None)  # import optuna raises ImportError
    assert main([*BAD, "--study-dir", str(tmp_path / "s")]) == 2
    assert capsys.readouterr().err.strip() == "fragc: error: fragc tune needs optuna: pip install 'fragc[tune]'"
    assert not (tmp_path / "s").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DEFAULT_SPACES))
def test_every_default_search_space_is_read_as_numbers_by_its_algorithm(name):
    """Traced and placed (no XLA compile): each default space's fields reach the program as traced values."""
    from fragc.algos import make
    from fragc.compiler import run_passes
    from fragc.options import CompileOptions
    from fragc.tune import default_space

    algo = make(name)
    space = default_space(name, algo)
    grid = {r.field: [r.low, r.high] for r in space}
    pipeline = run_passes(algo, CompileOptions(fragc.population("single", 1, **grid)))[0]
    assert [f for f, _ in pipeline.final.hyperparameters] == [r.field for r in space]


def test_a_trial_left_running_by_a_killed_process_is_failed_and_asked_again_first(tmp_path):
    """No compile: a study whose process died with a trial running, reopened."""
    study = open_study(str(tmp_path), "random", "none")
    left = study.ask()
    SPACE[0].suggest(left)  # a killed `fragc tune`: asked, never told
    study = open_study(str(tmp_path), "random", "none")
    assert study.trials[0].state.name == "FAIL"
    again = study.ask()
    assert SPACE[0].suggest(again) == left.params["lr"] and again.number == 1
