"""Learning curves from `fragc run --metrics` files (matplotlib, headless)."""

from __future__ import annotations

import json

from fragc.ir.errors import FragcError


def read_metrics(path: str) -> list[dict]:
    try:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except OSError as err:
        raise FragcError(f"cannot read metrics file '{path}': {err.strerror}") from err
    except json.JSONDecodeError as err:
        raise FragcError(f"'{path}' is not a fragc metrics file (line {err.lineno}: {err.msg})") from err
    if not rows or "env_steps" not in rows[0]:
        raise FragcError(f"'{path}' has no metric lines (write one with fragc run --metrics FILE)")
    return rows


def plot_learning_curve(path: str, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(path)
    steps = [r["env_steps"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [r.get("episode_return", float("nan")) for r in rows], color="tab:blue")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("mean episode return")
    ax.set_title(path.rsplit("/", 1)[-1])
    ax.grid(alpha=0.3)
    save_figure(fig, out)


def save_figure(fig, path: str) -> None:
    """Write a matplotlib figure to PNG and free it; a clear error if the path is unwritable."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    except OSError as err:
        raise FragcError(f"cannot write plot '{path}': {err.strerror}") from err
    finally:
        plt.close(fig)
