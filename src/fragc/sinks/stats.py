"""Statistics over seeds for sweeps and `bench/results.py`: the interquartile mean (IQM) of per-seed scores, its
95% stratified-bootstrap confidence interval, seeds at a threshold, the best configuration, a text table and a PNG
of learning curves with CI bands (min-max bands over few seeds).

The numbers come from `rliable` (Agarwal et al., "Deep Reinforcement Learning at the Edge of the Statistical
Precipice", NeurIPS 2021), not from a bootstrap of our own. The IQM (the mean of the middle 50% of runs) and
stratified bootstrap CIs are what that paper recommends for reporting RL results over few seeds, rliable is the
maintained reference implementation of them (google-research/rliable), and it is what the RL community cites:
numbers computed with it mean the same as everyone else's, and a reader need not audit our resampling. rliable is an
optional dependency (`pip install 'fragc[sweep]'`), imported only when a function here runs (and matplotlib only
when a curve is drawn); `fragc sweep`'s report imports this module.

Scores are one configuration's per-seed final scores, a 1-D array (one value per seed). rliable wants
[runs, tasks]; here there is one task, so the stratified bootstrap resamples the seeds with replacement.

Determinism: rliable 1.2's `StratifiedBootstrap` takes a `random_state` but draws its resampling indices from
NumPy's global random state (`np.random.choice`), so the state passed alone does not fix the interval. Each
estimate here passes a `RandomState(seed)` *and* seeds the global state with `seed` for the duration of the call,
restoring it afterwards: the same scores and seed give the same interval, whatever ran before, and each
configuration's interval depends only on its own scores (not on the other labels or their order).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from fragc.ir.errors import FragcError

CURVE_REPS = 200
"""Bootstrap replications per point of a learning curve (`curves_png`): the bands are drawn, not reported, and 200
keeps a few hundred points under a second per configuration; the final scores use `interval_estimates`' 2,000."""


def _rliable():
    """(rliable.library, rliable.metrics), or one line saying how to install them."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # arch and seaborn warn about their own dependencies on import
            from rliable import library, metrics
    except ImportError:
        raise FragcError("fragc.sinks.stats needs rliable: pip install 'fragc[sweep]'") from None
    except Exception as err:  # installed, but broken by a dependency (e.g. arch < 8 under pandas 3)
        raise FragcError(f"fragc.sinks.stats needs rliable, which is installed but failed to import "
                         f"({type(err).__name__}: {err}): pip install 'fragc[sweep]'") from None
    return library, metrics


def _scores(scores, what: str = "scores") -> np.ndarray:
    x = np.asarray(scores, np.float64)
    if x.ndim != 1 or x.size == 0:
        raise FragcError(f"{what}: expected a non-empty 1-D array of per-seed scores, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise FragcError(f"{what}: scores must be finite, got {x.tolist()}")
    return x


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[np.random.RandomState]:
    """NumPy's global random state seeded with `seed` inside the block and restored after it (see the module
    docstring: rliable 1.2 resamples with `np.random.choice`); yields a `RandomState(seed)` to pass as well."""
    saved = np.random.get_state()
    np.random.seed(seed)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # arch: random_state is deprecated in favour of generator
            yield np.random.RandomState(seed)
    finally:
        np.random.set_state(saved)


def trimmed_mean(x: np.ndarray, axis: int | None = None) -> np.ndarray:
    """scipy's `trim_mean(x, 0.25, axis)` to the bit (its partition, slice and mean), without scipy's wrapper:
    the bootstrap calls it once per replication, and the wrapper's checks were 0.4 ms of each call (20,000 calls in
    a test run of the sweeps' reports). `tests/test_stats.py` checks it against rliable's `aggregate_iqm`."""
    a = np.asarray(x)
    if axis is None:
        a, axis = a.ravel(), 0
    low = int(0.25 * a.shape[axis])
    high = a.shape[axis] - low
    kept = [slice(None)] * a.ndim
    kept[axis] = slice(low, high)
    return np.mean(np.partition(a, (low, high - 1), axis)[tuple(kept)], axis=axis)


def iqm(scores) -> float:
    """Interquartile mean of a 1-D array of per-seed scores: rliable's `metrics.aggregate_iqm` (the 25%-trimmed
    mean, scipy's `trim_mean(x, 0.25)`)."""
    _, metrics = _rliable()
    return float(metrics.aggregate_iqm(_scores(scores)[:, None]))


def interval_estimates(scores: Mapping[str, np.ndarray], reps: int = 2000, level: float = 0.95,
                       seed: int = 0) -> dict[str, tuple[float, float, float]]:
    """{label: (IQM, low, high)}: each configuration's IQM over its seeds and the `level` percentile confidence
    interval of a stratified bootstrap with `reps` replications (rliable's `library.get_interval_estimates`),
    the same for the same scores and seed."""
    if not 0 < level < 1:
        raise FragcError(f"interval_estimates: level must be in (0, 1), got {level}")
    if reps < 1:
        raise FragcError(f"interval_estimates: reps must be at least 1, got {reps}")
    library, _ = _rliable()

    def func(x: np.ndarray) -> np.ndarray:  # rliable's aggregate_iqm, the trimmed mean over all runs
        return np.array([trimmed_mean(x)])

    out = {}
    for label, values in scores.items():
        x = _scores(values, f"interval_estimates[{label!r}]")[:, None]  # [runs, tasks = 1]
        with _seeded(seed) as random_state:
            points, intervals = library.get_interval_estimates(
                {label: x}, func, reps=reps, confidence_interval_size=level, random_state=random_state)
        out[label] = (float(points[label][0]), float(intervals[label][0, 0]), float(intervals[label][1, 0]))
    return out


def seeds_at_threshold(scores, threshold: float) -> int:
    """How many seeds' scores reach `threshold` (score >= threshold)."""
    return int(np.sum(_scores(scores) >= threshold))


def best_configuration(estimates: Mapping[str, tuple[float, float, float]]) -> str:
    """The label with the highest IQM in `interval_estimates`' result (ties: the first)."""
    if not estimates:
        raise FragcError("best_configuration: no configurations")
    best = None
    for label, (point, _, _) in estimates.items():
        if best is None or point > estimates[best][0]:
            best = label
    return best


FINAL_WINDOW = 0.1
"""A run's final score is its mean over the last tenth of its reported points (`final_window`), which for
`fragc sweep` and `fragc tune` are its iterations: the last iteration alone is too noisy to rank runs by."""


def final_window(points: int) -> int:
    """How many of the last of `points` reported points (a sweep's or a trial's iterations) a final score
    averages: a tenth, at least 1."""
    return max(1, int(points * FINAL_WINDOW))


def final_scores(curves: np.ndarray) -> np.ndarray:
    """Per run (row of `curves`, [runs, points]), the mean of its last `final_window(points)` points."""
    x = np.asarray(curves, np.float64)
    return np.mean(x[:, -final_window(x.shape[1]):], axis=1)


FEW_SEEDS = 4
"""Up to this many seeds, the 95% CI of the IQM is the seeds' min-max: a resample's IQM is the lowest score when
enough of its draws are (all 3 of 3: probability 1/27; 3 or 4 of 4, whose IQM is the middle two: 5.1%), which is
more often than the CI's 2.5% tail; from 5 seeds it is 0.7% and falling."""


def few_seeds_note(seeds: int) -> str | None:
    """What the IQM and its CI reduce to over so few seeds that they do not mean what they usually mean (`FEW_SEEDS`),
    or None. Below 4 seeds the IQM trims nothing (a quarter of 3 is 0 seeds): it is the mean."""
    if seeds > FEW_SEEDS:
        return None
    iqm = "the mean" if seeds < 4 else "the mean of the middle two"
    return (f"note: with {seeds} seed{'s' if seeds > 1 else ''} the IQM is {iqm} and the 95% CI is the seeds' "
            f"min-max; run 10 or more seeds for an IQM and a CI that mean what they usually mean")


def curve_estimates(curves: Mapping[str, np.ndarray], reps: int = CURVE_REPS, level: float = 0.95,
                    seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """{label: (IQM, low, high)}, each an array over the curve's points: `curves[label]` is [seeds, points], and
    at each point the IQM over seeds with its stratified-bootstrap interval (rliable's `get_interval_estimates` on
    [runs, 1 task, points], which resamples the seeds independently at each point). The statistic is rliable's
    `aggregate_iqm` evaluated per point, vectorised as `trimmed_mean(x, axis=0)` (the same number: `aggregate_iqm`
    is scipy's `trim_mean` over all runs of its one task)."""
    library, _ = _rliable()

    def func(x: np.ndarray) -> np.ndarray:
        return trimmed_mean(x[:, 0, :], axis=0)

    out = {}
    for label, values in curves.items():
        x = np.asarray(values, np.float64)
        if x.ndim != 2 or 0 in x.shape:
            raise FragcError(f"curves[{label!r}]: expected [seeds, points], got shape {x.shape}")
        with _seeded(seed) as random_state:
            points, intervals = library.get_interval_estimates(
                {label: x[:, None, :]}, func, reps=reps, confidence_interval_size=level, random_state=random_state)
        out[label] = (np.asarray(points[label]), np.asarray(intervals[label][0]), np.asarray(intervals[label][1]))
    return out


def curves_png(curves: Mapping[str, np.ndarray], steps: np.ndarray, path: str, ylabel: str = "episode return",
               title: str = "", window: tuple[float, float] | None = None, finals: Mapping[str, float] | None = None,
               legend_title: str = "") -> str:
    """One PNG of learning curves at `path` (`curves_figure`, drawn on matplotlib's Agg canvas without pyplot, so
    no display and no global backend change). Returns `path`."""
    fig = curves_figure(curves, steps, ylabel, title, window, finals, legend_title)
    fig.savefig(path, format="png")
    return path


def curves_figure(curves: Mapping[str, np.ndarray], steps: np.ndarray, ylabel: str = "episode return",
                  title: str = "", window: tuple[float, float] | None = None,
                  finals: Mapping[str, float] | None = None, legend_title: str = "") -> Any:
    """Learning curves as a matplotlib Figure: per configuration a line of the IQM over seeds at each point of
    `steps` (environment steps, the x axis: every point given, none left out) and a shaded band: the 95%
    stratified-bootstrap CI (`curve_estimates`, `CURVE_REPS` replications per point), or over `FEW_SEEDS` seeds
    or fewer the seeds' min-max (what that CI is then, `few_seeds_note`), drawn as such; the legend says which.
    `curves[label]` is [seeds, points]. `window` (first and last step of the final score's points) is shaded,
    `finals` (label -> the final score's IQM) is written in each label, and `legend_title` heads the legend."""
    steps = np.asarray(steps)
    for label, values in curves.items():
        if np.ndim(values) != 2 or np.shape(values)[1] != steps.shape[0]:
            raise FragcError(f"curves[{label!r}]: expected [seeds, {steps.shape[0]}] (one column per step), "
                             f"got shape {np.shape(values)}")
    estimates = curve_estimates(curves)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise FragcError("fragc.sinks.stats.curves_png needs matplotlib: pip install 'fragc[sweep]'") from None
    fig = Figure(figsize=(7, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    seeds = {label: np.shape(values)[0] for label, values in curves.items()}
    for i, (label, (point, low, high)) in enumerate(estimates.items()):
        color = f"C{i % 10}"
        if seeds[label] <= FEW_SEEDS:  # the bootstrap's band is then the min-max (by chance): drawn exactly
            x = np.asarray(curves[label], np.float64)
            low, high = np.min(x, axis=0), np.max(x, axis=0)
        final = f", final {finals[label]:.1f}" if finals and label in finals else ""
        ax.plot(steps, point, color=color, linewidth=1.8, label=f"{label} (IQM, {seeds[label]} seeds{final})")
        ax.fill_between(steps, low, high, color=color, alpha=0.2, linewidth=0)
    if window is not None:
        ax.axvspan(window[0], window[1], color="0.5", alpha=0.15, linewidth=0, label="final score's window")
    ax.set_xlabel("environment steps")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small", title_fontsize="x-small",
              title="\n".join(t for t in (legend_title, band_legend(list(seeds.values()))) if t))
    fig.tight_layout()
    return fig


def band_legend(seeds: list[int]) -> str:
    """What the shaded bands of curves over `seeds` seeds each are, for the legend."""
    few = [n <= FEW_SEEDS for n in seeds]
    if all(few):
        return "shaded: the seeds' min-max"
    if not any(few):
        return "shaded: 95% bootstrap CI of the IQM"
    return f"shaded: 95% bootstrap CI of the IQM ({FEW_SEEDS} seeds or fewer: the seeds' min-max)"


def report_table(estimates: Mapping[str, tuple[float, float, float]],
                 seeds_at: Mapping[str, int | tuple[int, int]] | None = None, threshold: float | None = None,
                 title: str = "", configuration: str = "configuration") -> str:
    """An aligned text table, one row per configuration: IQM, its 95% CI and (with `seeds_at` and `threshold`)
    the seeds at the threshold, given as a count or as (count, seeds); the best configuration's row is marked
    with `*`. `title` is a line above it (what the scores are); `configuration` heads the labels' column."""
    if not estimates:
        raise FragcError("report_table: no configurations")
    best = best_configuration(estimates)
    show_threshold = seeds_at is not None and threshold is not None
    header = ["", configuration, "IQM", "95% CI"] + ([f"seeds >= {threshold:g}"] if show_threshold else [])
    rows = []
    for label, (point, low, high) in estimates.items():
        row = ["*" if label == best else "", label, f"{point:.1f}", f"[{low:.1f}, {high:.1f}]"]
        if show_threshold:
            at = seeds_at.get(label)
            row.append("-" if at is None else f"{at[0]}/{at[1]}" if isinstance(at, tuple) else str(at))
        rows.append(row)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    right = {2, 3, 4}  # numbers right-aligned

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join(([title] if title else []) + [line(header), line(["-" * w for w in widths]), *map(line, rows),
                      f"* best {configuration} (highest IQM): {best}"])
