"""Learning curves from `fragc run --metrics` files (matplotlib, headless: figures drawn without pyplot, so no
display and no global backend change)."""

from __future__ import annotations

import json
import numbers
import os

from matplotlib.backend_bases import FigureCanvasBase
from matplotlib.figure import Figure

from fragc.ir.errors import FragcError


def read_metrics(path: str) -> list[dict]:
    """The rows of a metrics file; a clear error naming the first line that is not a metric row."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    except OSError as err:
        raise FragcError(f"cannot read metrics file '{path}': {err.strerror}") from err
    except UnicodeDecodeError as err:
        raise FragcError(f"'{path}' is not a fragc metrics file (not UTF-8 text: {err.reason} at byte "
                         f"{err.start})") from err
    if not lines:
        raise FragcError(f"'{path}' has no metric lines (write one with fragc run --metrics FILE)")
    return [_metric_row(path, n, line) for n, line in lines]


def _metric_row(path: str, n: int, line: str) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise FragcError(f"'{path}' is not a fragc metrics file (line {n}: {err.msg})") from err
    if not isinstance(row, dict):
        raise FragcError(f"'{path}' is not a fragc metrics file (line {n} is not a JSON object)")
    if not isinstance(row.get("env_steps"), numbers.Real):
        raise FragcError(f"'{path}' is not a fragc metrics file (line {n} has no numeric env_steps)")
    return row


def plot_learning_curve(path: str, out: str) -> None:
    check_figure_path(out)
    rows = read_metrics(path)
    steps = [r["env_steps"] for r in rows]
    returns = [r.get("episode_return") for r in rows]
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    ax.plot(steps, [r if isinstance(r, numbers.Real) else float("nan") for r in returns], color="tab:blue")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("mean episode return")
    ax.set_title(path.rsplit("/", 1)[-1])
    ax.grid(alpha=0.3)
    save_figure(fig, out)


def check_figure_path(path: str) -> None:
    """Refuse an image format matplotlib cannot write, before anything is drawn (no suffix: PNG)."""
    suffix = os.path.splitext(path)[1][1:].lower()
    supported = FigureCanvasBase.get_supported_filetypes()
    if suffix and suffix not in supported:
        raise FragcError(f"cannot write plot '{path}': unknown image format '.{suffix}' (known: "
                         f"{', '.join(sorted(supported))})")


def save_figure(fig: Figure, path: str) -> None:
    """Write a matplotlib figure to PNG; a clear error if the path is unwritable."""
    try:
        check_figure_path(path)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    except OSError as err:
        raise FragcError(f"cannot write plot '{path}': {err.strerror}") from err
