"""`fragc tune` refuses, in one line with exit code 2 and before anything trains or is written: a metric the
algorithm does not report (known once it is traced), and a study folder whose journal Optuna cannot read."""

import re

import pytest

import fragc.tune
from fragc.cli import main
from fragc.tune import open_study

optuna = pytest.importorskip("optuna")

FIT = ["tune", f"{__file__.replace('test_tune_refusals', 'test_tune')}:Fit", "--iterations", "20",  # its tiny toy
       "--iterations-per-dispatch", "4", "--batch", "2", "--lr", "log:0.01..0.5", "--sampler", "random",
       "--trials", "2"]
PPO = ["tune", "ppo", "--lr", "log:1e-4..1e-2", "--trials", "2"]


def never_compiled(*args, **kwargs):
    raise AssertionError("compiled a program: the metric should have been refused once traced")


@pytest.mark.parametrize("argv,message", [
    ([*FIT, "--metric", "scor"],
     r"^fragc: error: tune: the algorithm reports no metric 'scor' \(did you mean 'score'\?\); it reports score$"),
    ([*FIT, "--metric", "nosuch"], r"^fragc: error: tune: the algorithm reports no metric 'nosuch'; it reports score$"),
    ([*PPO, "--metric", "episode_retrun"], r"no metric 'episode_retrun' \(did you mean 'episode_return'\?\); it "
                                           r"reports actor_loss, .*episode_return, .*value_loss$"),
], ids=["close", "far", "ppo"])
def test_a_metric_the_algorithm_does_not_report_is_refused_once_traced(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.setattr(fragc.tune, "Program", never_compiled, raising=False)  # refused between trace and compile
    study_dir = tmp_path / "study"
    assert main([*argv, "--study-dir", str(study_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert re.search(message, err) and len(err.splitlines()) == 1, err
    assert not study_dir.exists()  # nothing left behind to refuse the corrected rerun


def journal_of_one_trial(directory) -> bytes:
    """A real study's journal (one finished trial), as Optuna writes it."""
    study = open_study(str(directory), "random", "none")
    trial = study.ask()
    trial.suggest_float("lr", 0.01, 0.5, log=True)
    study.tell(trial, 1.0)
    return (directory / fragc.tune.JOURNAL).read_bytes()


@pytest.mark.parametrize("damage,why", [
    (lambda journal: bytes(range(256)) * 2, r"it is not text: UnicodeDecodeError: 'utf-8' codec can't decode"),
    (lambda journal: journal[:len(journal) // 2], r"its last line \(\d+\) is cut off"),  # a write cut short
    (lambda journal: journal[:-2] + b"\n", r"line \d+ is not JSON: JSONDecodeError"),
    (lambda journal: b"[1, 2]\n" + journal, r"line 1 is not one of Optuna's operations"),
    (lambda journal: b'{"op_code": 99, "worker_id": "w"}\n', r"AssertionError: Should not reach"),  # Optuna's own
], ids=["binary", "cut-short", "not-json", "not-an-operation", "unknown-operation"])
def test_a_damaged_journal_is_refused_in_one_line_naming_it(capsys, tmp_path, damage, why):
    (tmp_path / "good").mkdir()
    study_dir = tmp_path / "study"
    study_dir.mkdir()
    journal = study_dir / fragc.tune.JOURNAL
    journal.write_bytes(damage(journal_of_one_trial(tmp_path / "good")))
    before = journal.read_bytes()
    assert main([*PPO, "--study-dir", str(study_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert re.search(rf"^fragc: error: tune: '{re.escape(str(journal))}' is damaged, not a study Optuna can read "
                     rf"\({why}.*\); move it away", err), err
    assert journal.read_bytes() == before and sorted(p.name for p in study_dir.iterdir()) == [journal.name]


def test_a_whole_journal_opens(tmp_path):
    """The check lets Optuna's own journal by: the study and its trial are there."""
    journal_of_one_trial(tmp_path)
    assert [t.state.name for t in open_study(str(tmp_path)).trials] == ["COMPLETE"]
