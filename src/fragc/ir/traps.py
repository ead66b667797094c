"""Mistakes that JAX lets through silently, or reports from deep inside tracing, caught by the frontend.

Each check names what is wrong in the user's terms (the state leaf, the fragment, the
line) and the usual fix; PureJaxRL's code, ported, meets each of them:

- `check_state_round_trip`: `iteration` must return a state of the type it takes
  (a LogWrapper that starts episode returns as the int 0 makes them float);
- `explain_carry_dtype`: the same inside a fragment's own `lax.scan`;
- `explain_static_argument`, `explain_unbound_axis`: a fragment's argument taken as a `jax.jit` static argument,
  and a collective over an axis of the user's naming, which JAX reports from deep inside tracing;
- `refuse_effects_outside_fragments`: a `jax.debug.print`/`callback` between
  fragments (PureJaxRL's DEBUG printing), which passes would drop or repeat;
- `explain_branch_outputs`: a `lax.cond`/`lax.switch` whose branches return different pytrees (metric dicts
  with different keys), which JAX reports in eight lines.
"""

from __future__ import annotations

import ast
import os
import re
import traceback
from typing import Any

import jax
from jax.extend import core as jex
from jax.extend import source_info_util

from .errors import FragcError, FragmentError
from .types import TreeType, leaf_key_paths


def check_state_round_trip(algo: Any, state_tree: Any, out_tree: Any, state_leaves: list, closed: Any) -> None:
    """The state that `iteration` returns must have the type of the one it takes."""
    new_state_tree = out_tree.children()[0]
    new_avals = closed.out_avals[: new_state_tree.num_leaves]
    old = [(tuple(x.shape), x.dtype) for x in state_leaves]
    new = [(tuple(a.shape), a.dtype) for a in new_avals]
    if new_state_tree == state_tree and old != new:
        paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(
            jax.tree.unflatten(state_tree, state_leaves))[0]]
        path, (shape, dtype), (new_shape, new_dtype) = next(d for d in zip(paths, old, new) if d[1] != d[2])
        raise FragcError(
            f"{type(algo).__name__}.iteration changes state leaf state{path} from {dtype}{list(shape)} to "
            f"{new_dtype}{list(new_shape)}; the training loop carries the state unchanged: make init create it "
            f"as {new_dtype}{list(new_shape)} (e.g. jnp.zeros({new_shape}, jnp.{new_dtype}) instead of 0), or "
            "cast it back in iteration"
        )
    if new_state_tree != state_tree or old != new:
        raise FragcError(
            f"{type(algo).__name__}.iteration returns a state whose structure, shapes or dtypes "
            "differ from the state it takes; the training loop carries it unchanged"
        )


_CARRY_DTYPE = re.compile(r"input carry (?:component |at path )?(?:(\S+) )?has type (\S+) but the corresponding "
                          r"output carry component has type (\S+), so the dtypes do not match")
"""JAX's message (jax/_src/lax/control_flow/loops.py, `_check_carry_type`) for a carry that changes dtype."""


def check_metric_names(algo: Any, out_tree: Any) -> None:
    """Every metric leaf must have a name of its own: history, logs and trackers key them by their dotted paths, so
    `{"loss": {"mse": a}, "loss.mse": b}` would keep one of the two."""
    seen: dict[str, str] = {}
    for path in leaf_key_paths(out_tree.children()[1]):
        name, written = jax.tree_util.keystr(path, simple=True, separator="."), f"metrics{jax.tree_util.keystr(path)}"
        if name in seen:
            raise FragcError(f"{type(algo).__name__}.iteration returns two metrics named '{name}' ({seen[name]} and "
                             f"{written}): metrics are kept by their keys joined with '.'; rename one")
        seen[name] = written


def explain_carry_dtype(name: str, arg_names: tuple[str, ...], arg_types: tuple[TreeType, ...],
                        err: TypeError) -> None:
    """A `lax.scan` whose step changes a carry's dtype (PureJaxRL's LogWrapper starts an episode
    return as the int 0 and adds float rewards): name the fragment, the line, the arguments it
    may come from, and the fix."""
    match = _CARRY_DTYPE.search(str(err))
    if match is None:
        return
    component, before, after = match.groups()
    dtype = before.split("[")[0]
    sources = [f"{arg}.{path}" if path else arg for arg, t in zip(arg_names, arg_types)
               for path, leaf in zip(t.paths, t.leaves) if leaf.dtype.name == dtype]
    hint = f"; arguments of dtype {dtype}: {', '.join(sources[:4])}" if sources else ""
    carry = f"carry {component}" if component else "carry"
    raise FragmentError(
        f"fragment '{name}': the lax.scan at {_user_line(err)} turns its {carry} from {before} into {after}{hint}. "
        f"The carry must keep its type: create it with the dtype the step makes (in init, e.g. "
        f"jnp.zeros(shape, jnp.{after.split('[')[0]}) instead of 0), or cast it back in the step (.astype(...))"
    ) from err


def explain_static_argument(name: str, source: str, arg_names: tuple[str, ...], arg_types: tuple[TreeType, ...],
                            err: ValueError) -> None:
    """A `jax.jit` inside a fragment that takes one of the fragment's (traced) arguments as a static one, which JAX
    reports as "Non-hashable static arguments": name the fragment and the Python numbers or bools it was likely
    given, and the fix."""
    if "Non-hashable static arguments" not in str(err):
        return
    numbers = [f"'{n}'" for n, t in zip(arg_names, arg_types) if len(t.leaves) == 1 and not t.leaves[0].shape
               and (t.leaves[0].weak_type or t.leaves[0].dtype == bool)]  # a Python number or bool, likely
    which = f" ({', '.join(numbers)})" if numbers else ""
    raise FragmentError(
        f"fragment '{name}' ({source}) hands a traced argument{which} "
        f"to a jax.jit inside it that takes it as a static argument: fragc traces a fragment's arguments, Python "
        f"numbers and bools too, as jax.jit does; choose the code from the algorithm (self.config) or a closure "
        f"(functools.partial of the jitted function), or pass a string or an enum member, which fragc binds "
        f"into the body") from None


_UNBOUND_AXIS = re.compile(r"unbound axis name: (\S+?)\.?(?:\s|$)")
"""JAX's account of a collective over an axis no transformation defines."""


def explain_unbound_axis(name: str, source: str, err: NameError) -> None:
    """A collective over an axis of the user's own naming (pmap-era code, `jax.lax.pmean(g, "batch")`): name the
    fragment and the axis, and fragc's own."""
    axis = _UNBOUND_AXIS.search(str(err))
    if axis is None:
        return
    raise FragmentError(
        f"fragment '{name}' ({source}) reduces over axis '{axis.group(1)}', which fragc does not "
        f"define: a fragment's replicas are the axis fragc.REPLICA; use fragc.pmean / fragc.psum (or "
        f"jax.lax.pmean(x, fragc.REPLICA))") from None


_DEPENDS_ON = re.compile(r"tracing the function (\w+) at .* depends on the values? of the arguments? (.*?)\.(?:\n|$)")
"""JAX's account of a tracer used as a Python value (jax/_src/interpreters/partial_eval.py, `_origin_msg`)."""


def explain_python_value(function: str, subject: str, leaf_names: list[str], err: TypeError, fix: str,
                         skip: frozenset[int] = frozenset(), error: type[FragcError] = FragcError) -> None:
    """Code that uses a traced value as a Python value (an `if`, a shape, a loop count) while fragc traces
    `function` (whose parameters are `*leaves`): JAX names the flat parameter (`leaves[3]`); name the user's
    value (`leaf_names`), the line, and the fix. Leaves in `skip` (a sweep's values, which the sweep explains)
    are left to the caller."""
    match = _DEPENDS_ON.search(str(err))
    if match is None or match.group(1) != function:
        return
    leaves = [int(i) for i in re.findall(r"leaves\[(\d+)\]", match.group(2))]
    if not leaves or max(leaves) >= len(leaf_names) or skip.intersection(leaves):
        return
    frames = _user_frames(traceback.extract_tb(err.__traceback__))
    where = short_location(frames[-1].filename, frames[-1].lineno) if frames else "?"
    values = ", ".join(leaf_names[i] for i in leaves)
    raise error(f"{subject} {values} as a Python value ({type(err).__name__} at {where}), but {fix}") from err


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""fragc's package folder: its frames are fragc's own, but for the algorithms', which are written as a user's are."""

_JAX = os.path.dirname(jax.__file__)


def _in_library(filename: str) -> bool:
    """Whether a frame is JAX's or fragc's own (not fragc.algos', whose algorithms are written as a user's are)."""
    if filename.startswith(_JAX + os.sep):
        return True
    return filename.startswith(_PACKAGE + os.sep) and not filename.startswith(os.path.join(_PACKAGE, "algos") + os.sep)


def _user_frames(frames: list[traceback.FrameSummary]) -> list[traceback.FrameSummary]:
    return [f for f in frames if not _in_library(f.filename)]


def user_site(source_info: Any) -> str | None:
    """The innermost frame of an equation's traceback that is neither JAX's nor fragc's, as `file.py:line`; None
    where it has none (JAX's own summary stops at fragc's frames: a fragment call is bound in src/fragc/ir/frontend.py)."""
    frames = getattr(getattr(source_info, "traceback", None), "frames", None) or []
    for frame in frames:
        if not _in_library(frame.file_name):
            return short_location(frame.file_name, frame.line_num)
    return None


def _user_line(err: BaseException) -> str:
    """file:line of the innermost frame of `err` in the user's code (not JAX's, not fragc's)."""
    frames = _user_frames(traceback.extract_tb(err.__traceback__))
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def caller() -> str:
    """`folder/file.py:line` of the innermost frame of the current stack in the user's code."""
    frames = _user_frames(traceback.extract_stack())
    return short_location(frames[-1].filename, frames[-1].lineno) if frames else "?"


def short_location(path: str, line: int | str) -> str:
    """`folder/file.py:line`: a source location as fragc prints it (the path's last two parts)."""
    return f"{'/'.join(path.replace(chr(92), '/').split('/')[-2:])}:{line}"


_EFFECT_NAMES = {"debug_print": "jax.debug.print", "debug_callback": "jax.debug.callback",
                 "io_callback": "jax.experimental.io_callback"}
"""What users call the primitives with effects that appear in iterations."""


def refuse_effects_outside_fragments(algo: Any, jaxpr: jex.Jaxpr, fragment_call: Any) -> None:
    """Glue between fragments is pure dataflow: passes drop what nothing reads, move it between
    device groups and replicate it, so a print or callback there would vanish or repeat."""
    for eqn in jaxpr.eqns:
        if eqn.primitive is not fragment_call and eqn.effects:
            inner, where = _first_effect(eqn, "")
            name = _EFFECT_NAMES.get(inner.primitive.name, inner.primitive.name)
            raise FragcError(
                f"{type(algo).__name__}.iteration calls {name} outside any fragment (at {where or '?'}); fragc "
                "runs only pure code between fragments: it drops what nothing reads. Call it inside a "
                "@fragc.fragment, or return the value as a metric (iteration's second result) and print it "
                "from the run's history"
            )


def _first_effect(eqn: jex.JaxprEqn, where: str) -> tuple[jex.JaxprEqn, str]:
    """The innermost equation with an effect inside `eqn` (a callback in a scan), and the user's line."""
    where = source_info_util.summarize(eqn.source_info) or where
    for sub in jex.jaxprs_in_params(eqn.params):
        for inner in sub.eqns:
            if inner.effects:
                return _first_effect(inner, where)
    return eqn, where


_BRANCHES = re.compile(r"^(cond|switch) branch(?: outputs must have the same pytree structure|es must have equal "
                       r"output types)")
"""JAX's account of branches whose results differ (jax/_src/lax/control_flow/conditionals.py,
`_check_branch_outputs`): in structure, then in types."""
_BRANCH_NAMES = re.compile(r"^(.+?) is .+? at \S+$", re.M)
_STRUCTURE_DIFF = re.compile(r"^(?:  \* )?(.+?) output(?: at path (\[.*?\]))? is a (.+?) but (.+?) output(?: at "
                             r"path \[.*?\])? is a (.+?), so (.+?)[;.]$")
_TYPE_DIFF = re.compile(r"output of (.+?)(?: at path (\[.*?\]))? has type (\S+) but the corresponding output of "
                        r"(.+?) has type (\S+?)(?:,|\.|;|$)", re.M | re.I)


def explain_branch_outputs(algo: Any, err: TypeError) -> None:
    """A `lax.cond` or `lax.switch` whose branches return different pytrees (metric dicts with different keys, a
    leaf in one and a tuple in another) or leaves of different types: name the line, the branches, and the keys
    or paths at which they differ, in one line."""
    text = str(err)
    match = _BRANCHES.match(text)
    if match is None:
        return
    api = f"lax.{match.group(1)}"
    differences = _structure_differences(text) or _type_differences(text)
    if not differences:
        return
    names = [re.sub(r"^branch(\d+)$", r"branch \1", n) for n in _BRANCH_NAMES.findall(text)[:2]]  # JAX's "branch2"
    which = f" ({' and '.join(names)})" if len(names) == 2 else ""
    raise FragcError(
        f"{type(algo).__name__}.iteration: the branches{which} of the {api} at {_short_user_line(err)} return "
        f"different results: {'; '.join(differences)}. Every branch must return the same keys, structure and "
        f"dtypes: return each metric from every branch (a placeholder such as jnp.float32(0) where a branch has "
        f"none)") from None


def _structure_differences(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        if (m := _STRUCTURE_DIFF.match(line)) is None:
            continue
        name1, path, thing1, name2, thing2, why = m.groups()
        where = f"at {path}: " if path else ""
        keys = _differing_keys(why, thing1, thing2)
        if keys:
            out.append(f"{where}the keys differ ({'each of ' * (',' in keys)}{keys} in one branch only)")
        else:
            out.append(f"{where}{name1} returns {_plain(thing1)} but {name2} {_plain(thing2)}")
    return out


def _differing_keys(why: str, thing1: str, thing2: str) -> str | None:
    """The keys in one branch's dict only: JAX names them for dicts of different sizes, and gives each dict's
    keys (its pytree metadata) for dicts of one size."""
    if (m := re.search(r"symmetric difference of key sets: \{(.*)\}", why)) is not None:
        return ", ".join(m.group(1).split())
    metas = [re.search(r"with pytree metadata (.*)$", t) for t in (thing1, thing2)]
    if all(metas):
        try:
            a, b = (ast.literal_eval(m.group(1)) for m in metas)
            return ", ".join(repr(k) for k in sorted(set(a) ^ set(b), key=str)) or None
        except (ValueError, SyntaxError, TypeError):
            return None
    return None


def _plain(thing: str) -> str:
    """JAX's `<class 'dict'> with 2 children` -> `a dict with 2 children` (it writes "is a {thing}")."""
    return "a " + re.sub(r"<class '(?:\w+\.)*(\w+)'>", r"\1", thing)


def _type_differences(text: str) -> list[str]:
    return [f"at {path}: " * bool(path) + f"{name1} returns {t1} but {name2} {t2}"
            for name1, path, t1, name2, t2 in _TYPE_DIFF.findall(text)]


def _short_user_line(err: BaseException) -> str:
    """`folder/file.py:line` of the innermost frame of `err` in the user's code."""
    frames = _user_frames(traceback.extract_tb(err.__traceback__))
    return short_location(frames[-1].filename, frames[-1].lineno) if frames else "?"
