"""Stopping a run that diverged: the first non-finite metric or state value ends it (exit code 3).

The checks cost no extra synchronisation (`CheckFinite`, a periodic action):
metrics reach the host one dispatch late anyway; the state is reduced on its
devices to one "all finite" flag per leaf after every dispatch, and the flags
travel with that dispatch's metrics; and the state is
checked again where it is already on the host, before a checkpoint is written,
so a non-finite state is never saved as the latest checkpoint.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fragc.ir.errors import FragcError

from .actions import Action, Run

EXIT_CODE = 3
"""`fragc run`'s exit code for a run that diverged (2 is a usage error)."""


class Diverged(FragcError):
    """A metric or a state value became NaN or infinite; the message names which, and when."""

    exit_code = EXIT_CODE

    def __init__(self, what: str, iteration: int, when: str = "in", note: str = ""):
        super().__init__(f"training diverged: {what} {when} iteration {iteration}{note}")
        self.what, self.iteration, self.when = what, iteration, when

    def keeping(self, saved_at: int | None, checkpointer: Any) -> "Diverged":
        """This error, naming the latest checkpoint: the last good state, to resume from."""
        if checkpointer is None:
            return self
        where = checkpointer.directory
        kept = (f"; the latest checkpoint in '{where}' is iteration {saved_at}" if saved_at is not None
                else f"; no checkpoint was written to '{where}'")
        return Diverged(self.what, self.iteration, self.when, kept)


class StateNotFinite(Diverged):
    """`CheckFinite`'s stop: a state leaf is not finite after iteration `iteration`."""

    def __init__(self, leaf: str, iteration: int):
        super().__init__(f"the state's {leaf} is not finite", iteration, when="after")
        self.leaf = leaf


class CheckFinite(Action):
    """Stop the run with `Diverged` at the first non-finite metric, or state leaf after a dispatch.

    After each dispatch every floating-point state leaf is reduced to one "all finite" flag where it
    lives (one small program per device set: one jit cannot read arrays on disjoint device sets); the
    flags reach the host with that dispatch's metrics."""

    def on_start(self, run: Run) -> None:
        self.population = bool(run.program.population)
        self.groups: list[list[int]] | None = None  # state leaf indices, by the device set they live on

    def on_dispatch(self, iteration: int, state: Any) -> Any:
        leaves = jax.tree.leaves(state)
        if self.groups is None:
            by_devices: dict[frozenset, list[int]] = {}
            for i, x in enumerate(leaves):
                if jnp.issubdtype(x.dtype, jnp.inexact):
                    by_devices.setdefault(frozenset(x.sharding.device_set), []).append(i)
            self.groups = list(by_devices.values())
            self.names = [jax.tree_util.keystr(p, simple=True, separator=".")
                          for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
        return [_all_finite([leaves[i] for i in idx]) for idx in self.groups]

    def on_metrics(self, iteration: int, metrics: dict, queued: Any) -> None:
        check_metrics(metrics, iteration, population=self.population)
        bad = sorted(i for idx, ok in zip(self.groups or [], queued or []) for i, good in zip(idx, np.asarray(ok))
                     if not good)
        if bad:
            raise StateNotFinite(self.names[bad[0]], iteration)


@jax.jit
def _all_finite(leaves: list[jax.Array]) -> jax.Array:
    """bool[len(leaves)]: whether each leaf (of a population: of every member) is all finite."""
    return jnp.stack([jnp.isfinite(x).all() for x in leaves])


def check_metrics(metrics: dict[str, Any], done: int, population: bool = False) -> None:
    """Raise `Diverged` for the first non-finite metric of a dispatch whose last iteration is `done`.

    metrics: metric -> host array with one row per iteration of the dispatch (axis 1 for a
    population, whose axis 0 is the seed)."""
    axis = 1 if population else 0
    first: tuple[int, str, float] | None = None
    for name, values in metrics.items():
        values = np.asarray(values)
        if not np.issubdtype(values.dtype, np.inexact):
            continue
        bad_rows = ~np.isfinite(values).reshape(values.shape[: axis + 1] + (-1,)).all(axis=-1)
        if population:
            bad_rows = bad_rows.any(axis=0)
        if bad_rows.any():
            row = int(np.argmax(bad_rows))
            if first is None or row < first[0]:
                taken = np.moveaxis(values, axis, 0)[row]
                first = (row, name, float(taken[~np.isfinite(taken)].flat[0]))
    if first is not None:
        row, name, value = first
        rows = next(iter(metrics.values())).shape[axis]
        raise Diverged(f"metric '{name}' is {value}", done - rows + row + 1)


def check_state(state: Any, iteration: int) -> None:
    """Raise `Diverged` if a floating-point leaf of a host `state` holds NaN or infinity."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        if jax.dtypes.issubdtype(leaf.dtype, np.inexact) and not np.isfinite(np.asarray(leaf)).all():
            raise Diverged(f"the state's {jax.tree_util.keystr(path, simple=True, separator='.')} is not finite",
                           iteration, when="after")
