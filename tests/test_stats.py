"""fragc.sinks.stats: the IQM against scipy and a hand-worked example, rliable's stratified bootstrap CI (contains the
estimate, narrows with more seeds, fixed by its seed), seeds at a threshold, the best configuration, the table, the
learning-curve PNG read back, and the one-line error without rliable."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import fragc
from fragc.sinks import stats

pytest.importorskip("rliable")


def scipy_stats():
    """scipy.stats, imported where a test compares with it: at the top it cost each xdist worker (every worker
    collects every file) 1.7 s."""
    import scipy.stats

    return scipy.stats


@pytest.mark.parametrize("n", [4, 8, 12, 40])
def test_iqm_is_the_25_percent_trimmed_mean(n):
    x = np.random.default_rng(n).normal(100, 30, size=n)
    assert stats.iqm(x) == pytest.approx(scipy_stats().trim_mean(x, 0.25), rel=1e-12)


@pytest.mark.parametrize("shape,axis", [((10, 1), None), ((7, 1), None), ((10, 1, 33), 0), ((5, 4), 0)])
def test_the_bootstraps_trimmed_mean_is_rliables_iqm_to_the_bit(shape, axis):
    """`trimmed_mean` (what the bootstrap calls per replication) against rliable's aggregate_iqm (over all runs)
    and scipy's trim_mean (per curve point), exactly; and a whole interval with each of them."""
    from rliable import library, metrics

    x = np.random.default_rng(sum(shape)).normal(100, 30, size=shape)
    want = metrics.aggregate_iqm(x) if axis is None else scipy_stats().trim_mean(x, 0.25, axis=axis)
    np.testing.assert_array_equal(stats.trimmed_mean(x, axis), want)
    if axis is None:
        with stats._seeded(3) as random_state:
            _, theirs = library.get_interval_estimates({"a": x}, lambda s: np.array([metrics.aggregate_iqm(s)]),
                                                       reps=300, random_state=random_state)
        assert stats.interval_estimates({"a": x[:, 0]}, reps=300, seed=3)["a"][1:] == tuple(theirs["a"][:, 0])


def test_iqm_by_hand():
    # sorted 1 2 | 3 4 5 6 | 10 1000: the middle half is 3, 4, 5, 6
    assert stats.iqm([10, 1, 1000, 2, 3, 4, 5, 6]) == pytest.approx(4.5)
    # ten seeds: int(0.25 * 10) = 2 dropped at each end, the mean of the middle six (3 .. 8)
    assert stats.iqm([1, 2, 3, 4, 5, 6, 7, 8, 9, 1000]) == pytest.approx(5.5)
    assert stats.iqm([500.0] * 10) == 500.0


def test_the_interval_contains_the_estimate_and_narrows_with_more_seeds():
    rng = np.random.default_rng(0)
    few, many = rng.normal(200, 50, size=5), rng.normal(200, 50, size=80)
    est = stats.interval_estimates({"few": few, "many": many}, reps=500)
    for label, x in (("few", few), ("many", many)):
        point, low, high = est[label]
        assert point == pytest.approx(stats.iqm(x))
        assert low <= point <= high
    assert est["many"][2] - est["many"][1] < est["few"][2] - est["few"][1]
    assert stats.interval_estimates({"solved": np.full(10, 500.0)}, reps=100) == {"solved": (500.0, 500.0, 500.0)}


def test_the_same_seed_gives_the_same_interval_and_leaves_numpys_global_state_alone():
    x = np.random.default_rng(1).normal(size=10)
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    a = stats.interval_estimates({"a": x, "b": x + 1}, reps=300, seed=7)
    np.random.random(5)  # whatever ran in between
    b = stats.interval_estimates({"b": x + 1, "a": x}, reps=300, seed=7)  # other order: each label on its own
    assert a == b
    assert stats.interval_estimates({"a": x}, reps=300, seed=8)["a"] != a["a"]
    np.random.seed(123)
    assert (np.random.get_state()[1] == before).all()


def test_seeds_at_threshold():
    assert stats.seeds_at_threshold([475.0, 474.9, 500.0, 10.0], 475) == 2
    assert stats.seeds_at_threshold([-150.0, -250.0], -200) == 1


def test_best_configuration_is_the_highest_iqm_and_the_first_on_a_tie():
    est = {"lr=1e-4": (300.0, 250.0, 350.0), "lr=3e-4": (480.0, 400.0, 500.0), "lr=1e-3": (480.0, 470.0, 490.0)}
    assert stats.best_configuration(est) == "lr=3e-4"
    with pytest.raises(fragc.FragcError):
        stats.best_configuration({})


def test_report_table_marks_the_best_and_aligns_columns():
    est = {"lr=1e-4": (300.0, 250.5, 350.0), "lr=3e-4": (480.0, 400.0, 500.0)}
    text = stats.report_table(est, {"lr=1e-4": 2, "lr=3e-4": (9, 10)}, 475)
    lines = text.splitlines()
    assert "IQM" in lines[0] and "seeds >= 475" in lines[0]
    best = next(line for line in lines if "lr=3e-4" in line and "[" in line)
    assert best.startswith("*") and "480.0" in best and "[400.0, 500.0]" in best and "9/10" in best
    assert "[250.5, 350.0]" in text and lines[-1].endswith("lr=3e-4")
    assert len({len(line) for line in lines[:2]}) == 1  # header and rule equally wide
    assert "seeds >=" not in stats.report_table(est)


def test_curves_png_is_a_png_of_the_figure(tmp_path):
    rng = np.random.default_rng(0)
    steps = np.arange(1, 301) * 1024
    curves = {"ppo": rng.normal(0, 1, (10, 300)).cumsum(1), "a2c": rng.normal(0, 1, (6, 300)).cumsum(1)}
    path = str(tmp_path / "curves.png")
    assert stats.curves_png(curves, steps, path, title="CartPole-v1") == path
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    image = matplotlib.image.imread(path)
    assert image.shape == (450, 700, 4) and image.std() > 0  # 7 x 4.5 inches at 100 dpi, not blank
    est = stats.curve_estimates({"ppo": curves["ppo"][:, :5]}, reps=50)["ppo"]
    assert np.allclose(est[0], [stats.iqm(curves["ppo"][:, j]) for j in range(5)])
    assert (est[1] <= est[0]).all() and (est[0] <= est[2]).all()
    with pytest.raises(fragc.FragcError, match=r"curves\['ppo'\]: expected \[seeds, 300\]"):
        stats.curves_png({"ppo": curves["ppo"][:, :10]}, steps, path)


def test_without_rliable_the_error_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "rliable", None)
    for call in (lambda: stats.iqm([1.0, 2.0]), lambda: stats.interval_estimates({"a": np.ones(4)})):
        with pytest.raises(fragc.FragcError) as err:
            call()
        assert str(err.value) == "fragc.sinks.stats needs rliable: pip install 'fragc[sweep]'"


def test_bad_scores_are_one_line():
    with pytest.raises(fragc.FragcError, match="non-empty 1-D"):
        stats.iqm([])
    with pytest.raises(fragc.FragcError, match=r"interval_estimates\['a'\].*1-D"):
        stats.interval_estimates({"a": np.ones((3, 2))})



@pytest.mark.parametrize("seeds", [2, 3, 4, 5])
def test_up_to_4_seeds_the_ci_is_the_min_max_and_a_note_says_what_the_iqm_is(seeds):
    """The note's claims, against hand computations: 3 seeds trim nothing (a quarter of 3 is 0), 4 trim one at each
    end; a bootstrap resample's IQM is the lowest score with probability 1/27 (3 seeds) or 5.1% (4), more than the
    CI's 2.5% tail, so the CI is the min-max; with 5 seeds (0.7%) it is narrower and no note is printed."""
    x = np.array([10.0, 40.0, 70.0, 130.0, 160.0])[:seeds]
    point, low, high = stats.interval_estimates({"a": x}, reps=2000)["a"]
    note = stats.few_seeds_note(seeds)
    by_hand = {2: 25.0, 3: 40.0, 4: (40.0 + 70.0) / 2, 5: (40.0 + 70.0 + 130.0) / 3}[seeds]
    assert point == pytest.approx(by_hand)
    if seeds <= 4:
        assert (low, high) == (x.min(), x.max())
        assert f"with {seeds} seeds the IQM is {'the mean of the middle two' if seeds == 4 else 'the mean'}" in note
        assert "95% CI is the seeds' min-max" in note
    else:
        assert x.min() < low and high < x.max() and note is None


def test_the_final_score_is_the_mean_of_the_last_tenth_of_the_reports():
    assert [stats.final_window(n) for n in (1, 9, 10, 19, 20, 105)] == [1, 1, 1, 1, 2, 10]
    curves = np.arange(40.0).reshape(2, 20)  # [runs, points]
    np.testing.assert_array_equal(stats.final_scores(curves), [(18 + 19) / 2, (38 + 39) / 2])
