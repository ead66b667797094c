"""The printed form of a module; the grammar is in docs/ir.md.

Types of more than one leaf get an alias (`!Runner`) printed once at the top;
fragment signatures show global types; node operands are printed as the
shortest `%value.path` that names exactly their leaves. The printer reads a
module (module.py, whose `str()` is this) by its fields alone: it imports the
graph's node kinds, not the module.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

import jax
import numpy as np

from .graph import Delay, For, Glue, Graph, GraphPath, HostLoop, If, RegionNode, Run, Stage, Transfer, Use, Value, While
from .types import TreeType


def _key(t: TreeType) -> tuple:
    """Alias identity: structure, shapes, dtypes, batch axes and groups."""
    return (t.treedef, tuple((leaf.shape, str(leaf.dtype), leaf.axis, leaf.group) for leaf in t.leaves))


def _one_group(t: TreeType) -> str | None:
    """The group every leaf of `t` lives on, if they all live on one."""
    groups = {leaf.group for leaf in t.leaves}
    return groups.pop() if len(groups) == 1 else None


def _unplaced(t: TreeType) -> TreeType:
    return t.with_leaves(tuple(leaf.replace(group=None) for leaf in t.leaves))


class _Aliases:
    """Names for multi-leaf types, in order of first appearance.

    A type whose top-level fields have aliases of their own prints those
    fields by alias (`learner: !Learner`).
    """

    def __init__(self) -> None:
        self.names: dict[tuple, str] = {}
        self.types: dict[tuple, TreeType] = {}

    def ref(self, t: TreeType, hint: str) -> str:
        if not t.leaves and t.treedef.num_nodes == 1:
            return "()"  # an empty tuple (a time loop that scans no inputs)
        if len(t.leaves) == 1 and t.treedef.num_nodes == 1:
            return str(t.leaves[0])
        placed = self.placed(t)
        if placed is not None:
            return placed
        key = _key(t)
        if key not in self.names:
            base = t.class_name or (hint[:1].upper() + hint[1:]).replace(".", "_")
            name, i = base, 1
            while name in self.names.values():
                name, i = f"{base}{i}", i + 1
            self.names[key], self.types[key] = name, t
        return "!" + self.names[key]

    def placed(self, t: TreeType) -> str | None:
        """`!Params@learner`: an alias named already, every leaf of it on one group (None if there is none)."""
        group = _one_group(t)
        if group is None or _key(t) in self.names:
            return None
        key = _key(_unplaced(t))
        return f"!{self.names[key]}@{group}" if key in self.names else None

    def lines(self) -> list[str]:
        out = []
        for key, name in self.names.items():
            t = self.types[key]
            out += [f"type !{name} = {{   // {len(t.leaves)} leaves, {human_bytes(t.nbytes)}",
                    *self._fields(t), "}"]
        return out

    def _fields(self, t: TreeType) -> list[str]:
        """One line a leaf, except a subtree at any depth that has an alias (an optimizer's moments, the
        parameters' type: `opt_state.1.0.mu: !Params`), one line for it."""
        return self._subtree_fields(t.treedef, t.leaves, t.path_parts, 0, 0)

    def _subtree_fields(self, treedef: Any, leaves: Sequence, parts: Sequence, offset: int, depth: int) -> list[str]:
        fields = []
        for child in treedef.children():
            n = child.num_leaves
            sub = TreeType(child, tuple(leaves[offset : offset + n]))
            path = ".".join(parts[offset][: depth + 1]) if n else ""
            if n > 1 and _key(sub) in self.names:
                fields.append(f"    {path}: !{self.names[_key(sub)]},")
            elif n > 1 and (placed := self.placed(sub)) is not None:
                fields.append(f"    {path}: {placed},")
            elif n > 1 and child.children():
                fields += self._subtree_fields(child, leaves, parts, offset, depth + 1)
            else:
                fields += [f"    {'.'.join(parts[i])}: {leaves[i]}," for i in range(offset, offset + n)]
            offset += n
        return fields


def alias_types(module: Module) -> dict[str, TreeType]:
    """The types the printed module names by alias (`!Runner`), by name: what `parse(text, bodies=module)` gives
    their pytree classes back from."""
    aliases = _Aliases()
    _print(module, aliases, False)
    return {aliases.names[key]: t for key, t in aliases.types.items()}


def format_module(module: Module, bodies: bool = False) -> str:
    return _print(module, _Aliases(), bodies)


def _print(module: Module, aliases: _Aliases, bodies: bool) -> str:
    frag_lines = []
    for fdef in module.fragments.values():
        frag_lines += _fragment_lines(fdef, aliases, bodies)
    graph_lines = _graph_lines(module, aliases)
    header = [f"// fragc.ir · {module.name} · after {module.label}"]
    header += [f"mesh @{m.name} = devices[{_ranges(m.devices)}]" for m in module.meshes]
    if module.population:
        header.append(f"population{' loop' if module.member_loop else ''} seeds=[{', '.join(map(str, module.population))}]"
                      + "".join(f" {name}=[{', '.join(map(repr, values))}]" for name, values in module.hyperparameters))
    if module.pbt is not None:
        header.append(module.pbt.header())
    if module.carrier is not None:
        header.append(f"transfers via {module.carrier}")
    if module.schedule is not None and module.schedule.executor is not None:
        header.append(f"schedule {module.schedule.executor} "
                      f"iterations_per_dispatch={module.schedule.iterations_per_dispatch}")
    return "\n".join(header + aliases.lines() + frag_lines + graph_lines) + "\n"


def _ranges(ids: Sequence[int]) -> str:
    if list(ids) == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}..{ids[-1]}" if len(ids) > 1 else str(ids[0])
    return ",".join(map(str, ids))


_PART_RESULTS = {"infer": ("hostOperands", "residuals"), "env_step": ("hostResults",),
                 "absorb": ("carry", "stepOutputs")}
"""Names of the results of a host loop's parts (src/fragc/ir/time_loop.py `PARTS`), for their type aliases."""


def _fragment_lines(fdef: FragmentDef, aliases: _Aliases, bodies: bool) -> list[str]:
    args = ", ".join(f"%{n}: {aliases.ref(t, n)}" for n, t in zip(fdef.arg_names, fdef.in_types))
    hints = _PART_RESULTS.get(fdef.name.rsplit(".", 1)[-1], ()) if fdef.part_of else ()
    results = ", ".join(aliases.ref(t, hints[i] if i < len(hints) else f"{fdef.name}Out{i}")
                        for i, t in enumerate(fdef.out_types))
    where = ""
    if fdef.placement is not None:
        where = " " + fdef.placement.where()
    eqns = len(fdef.body.jaxpr.eqns) if fdef.body is not None else "?"
    lines = [
        f"fragment @{fdef.name} role={fdef.role}{where} eqns={eqns}   // {fdef.source}",
        f"    ({args}) -> ({results})",
    ]
    lines += [f"    {step.line()}" for step in fdef.host_steps]
    if fdef.placement is not None and fdef.placement.env_groups and not fdef.part_of:
        lines.append(f"    {_host_loop_line(fdef)}")
    if fdef.placement is not None and fdef.placement.env_fleet and fdef.host_steps and not fdef.part_of:
        lines.append(f"    {_fleet_line(fdef)}")
    if bodies and fdef.body is not None:  # the body that is compiled: per-replica shapes once placed
        body = fdef.body_for(fdef.placement.replicas) if fdef.placement and not fdef.part_of else fdef.body
        lines += ["    " + line for line in str(body).splitlines()]
    return lines


def _host_loop_line(fdef: FragmentDef) -> str:
    """How a host loop runs the fragment's time loop (derived from its placement: the parser skips it)."""
    p = fdef.placement
    n = fdef.batch_length()
    per_group = f" envs_per_group={n // (p.replicas * p.env_groups)}" if n else ""
    steps = f" steps={fdef.host_steps[0].calls}" if fdef.host_steps else ""
    overlap = ("a group's inference overlaps the others' host steps" if p.env_groups > 1
               else "synchronous: inference and host steps alternate")
    return (f"host loop groups={p.env_groups}{per_group}{steps}   // each step, each group: infer on "
            f"@{p.group}, the host step on cpu, absorb on @{p.group}; {overlap}")


def _fleet_line(fdef: FragmentDef) -> str:
    """Where the fragment's host environments step: the remote groups of its fleet and what crosses to each worker
    per step (derived from its placement and host steps: the parser skips it)."""
    p, step = fdef.placement, fdef.host_steps[-1]
    workers, _, rest = p.env_fleet.partition(":")[2].partition("x")
    n, e = int(workers), int(rest.split(",")[0] or 0)
    pools = p.replicas * max(p.env_groups, 1)
    envs = n * e
    per_worker = lambda b: b // step.calls // envs * e if envs else 0  # noqa: E731
    groups = ", ".join(f"group {g}: workers {g * n // pools}..{(g + 1) * n // pools - 1}" for g in range(pools))
    return (f"env fleet {p.env_fleet} remote_groups={pools}   // {groups} (ray actors of {e} environments); "
            f"per step each worker's share of the host step: {human_bytes(per_worker(step.to_host))} in (actions, "
            f"keys), {human_bytes(per_worker(step.from_host))} out (observations, rewards, flags)")


@dataclasses.dataclass(frozen=True)
class TransferNote:
    """How a transfer inside regions prints its bytes: `trips` times a call of the iteration (None: a `while`'s
    trips are data), or, in a host loop's step, a step on one replica and `per_call` steps and replicas a call."""

    trips: int | None = 1
    per_call: int = 0

    def inside(self, trips: int | None) -> "TransferNote":
        """The note inside a loop of `trips` trips (None: a `while`)."""
        return TransferNote(None if trips is None or self.trips is None else self.trips * trips)

    def text(self, t: Transfer) -> str:
        if self.per_call:
            return f"{human_bytes(t.nbytes)} a step per replica, {human_bytes(t.nbytes * self.per_call)} a call"
        if self.trips is None:
            return f"{human_bytes(t.nbytes)} a trip"
        if self.trips == 1:
            return human_bytes(t.nbytes)
        return f"{human_bytes(t.nbytes)} a trip, {human_bytes(t.nbytes * self.trips)} a call"


def _graph_lines(module: Module, aliases: _Aliases) -> list[str]:
    graph = module.graph
    params = ", ".join(f"%{v.name}: {aliases.ref(v.type, v.name)}" for v in graph.inputs)
    lines = ["", f"func @iteration({params}) {{"]
    lines += _nodes_lines(graph, (), module, aliases, "  ")
    state_tree, metrics_tree = graph.out_tree.children()
    n_state = state_tree.num_leaves
    state_out = _tree_operand(graph.outputs[:n_state], state_tree)
    metrics_out = _tree_operand(graph.outputs[n_state:], metrics_tree)
    lines += wrap(f"  return state={state_out}, metrics={metrics_out}", "         ")
    lines.append("}")
    return lines


WIDTH = 120
"""Printed lines are wrapped at this width where the grammar allows (the return line)."""


def wrap(line: str, indent: str, width: int = WIDTH) -> list[str]:
    """`line` broken after `, ` into lines of at most `width` characters where it can be (a part longer than that
    stays whole), continuation lines after `indent`; read back by joining the lines with one space."""
    if len(line) <= width:
        return [line]
    out, current = [], ""
    for part in re.split(r"(?<=,) ", line):
        candidate = f"{current} {part}" if current else part
        if current and len(candidate) > width:
            out.append(current)
            candidate = indent + part
        current = candidate
    return out + [current]


def _nodes_lines(graph: Graph, path: GraphPath, module: Module, aliases: _Aliases, indent: str,
                 note: TransferNote = TransferNote()) -> list[str]:
    """A graph's nodes, in their stages (the schedule's at `path`); `note`: how the regions around them make a
    transfer print its bytes (a trip and a call)."""
    lines = []
    stages = module.schedule.stages_of(path) if module.schedule is not None else ()
    stage_of = {i: s for s in stages for i in s.nodes}
    for i, node in enumerate(graph.nodes):
        stage = stage_of.get(i)
        if stage is not None and i == stage.nodes[0]:
            lines.append(f"{indent}stage @{stage.name} on @{stage.group}({operands(stage.inputs)}) {{")
        inner = indent + "  " if stage is not None else indent
        if node.regions:
            lines += _region_node_lines(node, path + (i,), module, aliases, inner, note)
        else:
            line = _node_line(node, module, aliases)
            if isinstance(node, Transfer):
                line = f"{line.split('   // ')[0]}   // {note.text(node)}"
            lines.append(inner + line)
        if stage is not None and i == stage.nodes[-1]:
            lines.append(f"{indent}}} -> ({operands(stage.outputs)})")
    return lines


def _region_node_lines(node: RegionNode, at: GraphPath, module: Module, aliases: _Aliases, indent: str,
                       note: TransferNote) -> list[str]:
    """`head {`, then each region (`^label(params):`, its nodes, `yield ...`), the kind's separators between them
    (`} else {`), and `}`: one form for every region kind, the head line the kind's (`REGION_HEADS`)."""
    head, order, separator, note = REGION_HEADS[node.kind](node, module, aliases, note)
    lines = [f"{indent}{head} {{"]
    for pos, k in enumerate(order):
        if pos and separator:
            lines.append(f"{indent}}} {separator} {{")
        region = node.regions[k]
        source = f"   // {node.source}" if pos == 0 and node.kind != "loop" else ""
        lines.append(f"{indent}  {_region_params(node.region_labels[k], region, aliases)}{source}")
        lines += _nodes_lines(region, at + (k,), module, aliases, indent + "  ", note)
        lines.append(f"{indent}  yield {_yield_operands(region.outputs)}")
    lines.append(f"{indent}}}")
    return lines


def _region_params(label: str, graph: Graph, aliases: _Aliases) -> str:
    """`^label(%a: T, ...)`; a parameter's type named after it without its number (`%ops1: !Ops`: the same type
    as the other branch's `%ops`)."""
    params = ", ".join(f"%{v.name}: {aliases.ref(v.type, re.sub(r'(?<=[A-Za-z_])[0-9]+$', '', v.name))}"
                       for v in graph.inputs)
    return f"^{label}({params}):"


def _for_head(node: For, module: Module, aliases: _Aliases, note: TransferNote) -> tuple:
    """`%carry, %ys = for trips=N consts(...) carry(...) xs(...)`."""
    nc, nk = node.num_consts, node.num_carry
    groups = (node.inputs[:nc], node.inputs[nc:nc + nk], node.inputs[nc + nk:])
    ops = " ".join(f"{name}({_yield_operands(g)})" for name, g in zip(("consts", "carry", "xs"), groups)
                   if g or name == "carry")  # an empty group of operands is not printed
    order = " reverse" if node.reverse else ""
    unroll = f" unroll={node.unroll}" if node.unroll != 1 else ""
    return f"{_outs(node)} = for trips={node.trips}{order}{unroll} {ops}", [0], None, note.inside(node.trips)


def _while_head(node: While, module: Module, aliases: _Aliases, note: TransferNote) -> tuple:
    """`%carry = while consts(...) body_consts(...) carry(...)`, then `^cond` and, after `} do {`, `^body`."""
    ops = " ".join(f"{name}({_yield_operands(g)})"
                   for name, g in zip(("consts", "body_consts", "carry"), node.split(node.inputs))
                   if g or name == "carry")  # an empty group of operands is not printed
    return f"{_outs(node)} = while {ops}", [0, 1], "do", note.inside(None)


def _if_head(node: If, module: Module, aliases: _Aliases, note: TransferNote) -> tuple:
    """`%b: T = if %p (...)` for two branches (`lax.cond`: `then` is branch 1, printed first), `switch %i (...)` for
    more (`lax.switch`)."""
    n = len(node.branches)
    keyword = "if" if n == 2 else "switch"
    types = aliases.ref(node.outputs[0].type, node.outputs[0].name)
    head = f"{_outs(node)}: {types} = {keyword} {operand(node.inputs[:1])} ({_yield_operands(node.inputs[1:])})"
    return head, ([1, 0] if n == 2 else list(range(n))), ("else" if n == 2 else None), note


def _loop_head(node: HostLoop, module: Module, aliases: _Aliases, note: TransferNote) -> tuple:
    """`%out... = loop @f(args) steps=T groups=G`. Its transfers print their bytes a step on one replica, and a
    call of the loop (every step, every replica)."""
    fdef = module.fragments[node.fragment]
    order = " reverse" if node.reverse else ""
    head = (f"{_outs(node)} = loop @{node.fragment}({', '.join(_arg_operands(node.inputs, fdef))}) "
            f"steps={node.steps}{order} groups={node.groups}")
    replicas = fdef.placement.replicas if fdef.placement else 1
    return head, [0], None, TransferNote(per_call=replicas * node.steps)


REGION_HEADS = {"for": _for_head, "while": _while_head, "if": _if_head, "loop": _loop_head}
"""Per region kind, its head line, the order its regions print in, the separator between them, and the note its
graphs' transfers get: `(head, order, separator, TransferNote)`."""


def _yield_operands(uses: Sequence[Use]) -> str:
    """Leaves in order, as few operands as name them (runs of one value's consecutive leaves, each as a
    subtree where it is one, else split into the subtrees it covers): what a region reads or yields."""
    parts, run = [], []
    for u in uses:
        if run and (u.value is not run[-1].value or u.index != run[-1].index + 1):
            parts += _run_names(run)
            run = []
        run.append(u)
    if run:
        parts += _run_names(run)
    return ", ".join(parts) if parts else "()"


def _run_names(run: list[Use]) -> list[str]:
    """Consecutive leaves of one value: one operand, or (where no subtree is exactly them) the subtrees that
    cover them, in order."""
    text = operand(run)
    if "#" not in text:
        return [text]
    cover = _cover(run[0].value, {u.index for u in run})
    return cover if len(cover) <= 2 else [text]


def _outs(node: object) -> str:
    return ", ".join(f"%{v.name}" for v in node.outputs)


def _tree_operand(uses: Sequence[Use], tree: object) -> str:
    """Operands of a returned pytree, field by field where one name does not cover them."""
    if not uses:  # no leaves: an empty dict of metrics prints as one
        return "{}" if isinstance(jax.tree.unflatten(tree, []), dict) else "()"
    if len(uses) == 1 and tree.num_nodes == 1:
        return _leaf_name(uses[0])  # a leaf, even where it is all of a one-leaf pytree value
    text = operand(uses)
    children = tree.children()
    if not (text.startswith("[") or "#" in text) or not children:  # one name covers them (not a run of leaves)
        return text
    keys = [parts[0] for parts in TreeType(tree, tuple(u.type for u in uses)).path_parts]
    fields, offset = [], 0
    for child in children:
        n = child.num_leaves
        fields.append(f"{keys[offset] if n else '?'}: {_tree_operand(uses[offset:offset + n], child)}")
        offset += n
    return "{" + ", ".join(fields) + "}"


def _node_line(node: object, module: Module, aliases: _Aliases) -> str:
    outs = ", ".join(f"%{v.name}" for v in node.outputs)
    if isinstance(node, Run):
        fdef = module.fragments[node.fragment]
        return f"{outs} = run @{node.fragment}({', '.join(_arg_operands(node.inputs, fdef))})"
    if isinstance(node, Glue):
        kinds = sorted({e.primitive.name for e in node.body.jaxpr.eqns}) if node.body is not None else ["?"]
        what = " ".join(kinds) if kinds else _const_text(node)
        ins = ", ".join(operand([u]) for u in node.inputs)
        types = ", ".join(str(t) for t in node.outputs[0].type.leaves)
        return f"{outs}: ({types}) = glue({ins})   // {what}"
    if isinstance(node, Transfer):
        return (f"{outs} = transfer {operand(node.inputs)} @{node.src} -> @{node.dst} via {node.carrier}"
                f"   // {human_bytes(node.nbytes)}")
    if isinstance(node, Delay):
        group = node.outputs[0].type.leaves[0].group if node.outputs[0].type.leaves else None
        where = f" on @{group}" if group else ""
        return f"{outs} = delay {operand(node.inputs)} init {operand(node.initial)}{where}"
    raise TypeError(f"unknown node kind {type(node).__name__}")


def _const_text(node: Glue) -> str:
    """`const 0.05`: a constant node with its value where it is a few numbers."""
    values = list(node.body.consts) if node.body is not None else []
    if len(values) == 1 and getattr(values[0], "size", 2) <= 4 and not _is_key_array(values[0]):
        x = np.asarray(values[0])
        text = str(x[()]) if x.ndim == 0 else " ".join(np.array2string(x, separator=",").split())
        return f"const {text}"
    return "const"


def _is_key_array(x: object) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _arg_operands(inputs: Sequence[Use], fdef: FragmentDef) -> list[str]:
    """A call's operands, argument by argument; an argument without leaves (an empty tuple) is not printed."""
    out, offset = [], 0
    for t in fdef.in_types:
        n = len(t.leaves)
        if n:
            out.append(operand(inputs[offset : offset + n], t))
        offset += n
    return out


def operands(uses: Sequence[Use]) -> str:
    """A set of leaves (a stage's inputs or outputs), value by value, each value's leaves named
    by the fewest subtrees that cover exactly them."""
    by_value: dict[Value, list[int]] = {}
    for u in uses:
        by_value.setdefault(u.value, []).append(u.index)
    return ", ".join(name for v, idx in by_value.items() for name in _cover(v, set(idx)))


def _cover(value: Value, chosen: set[int]) -> list[str]:
    parts = _parts(value)
    out: list[str] = []

    def visit(prefix: tuple[str, ...], members: list[int]) -> None:
        if all(i in chosen for i in members):
            out.append(f"%{value.name}" + "".join(f".{p}" for p in prefix))
            return
        children: dict[str, list[int]] = {}
        for i in members:
            children.setdefault(parts[i][len(prefix)], []).append(i)
        for key, under in children.items():
            if any(i in chosen for i in under):
                visit(prefix + (key,), under)

    visit((), list(range(len(parts))))
    return out


def operand(uses: Sequence[Use], expected: TreeType | None = None) -> str:
    """The shortest text naming exactly these leaves: `%v`, `%v.a.b`, or `[...]`; given the type they are
    passed as, `%base {path: operand, ...}` where that is shorter than `[...]` (a rebuilt pytree)."""
    uses = list(uses)
    if not uses:
        return "()"
    value = uses[0].value
    indices = [u.index for u in uses]
    if all(u.value is value for u in uses) and indices == list(range(len(value.type.leaves))):
        return f"%{value.name}"  # the whole value, in order (transfers carry flat tuples of leaves)
    if all(u.value is value for u in uses) and indices == list(range(indices[0], indices[0] + len(uses))):
        named = _subtree_name(value, indices, expected)
        if named is not None:
            return named
    if len(uses) == 1:
        return _leaf_name(uses[0])
    if all(u.value is value for u in uses) and indices == list(range(indices[0], indices[0] + len(uses))):
        return f"%{value.name}#{indices[0]}..{indices[-1]}"  # a run of a flat value's leaves (a region's)
    listed = "[" + ", ".join(_leaf_name(u) for u in uses) + "]"
    rebuilt = _rebuilt_operand(uses, expected) if expected is not None else None
    return rebuilt if rebuilt is not None and len(rebuilt) < len(listed) else listed


_PLAIN_KEY = re.compile(r"[^\s.,:#%()\[\]{}]+")
"""A key the override form can print as it is (none of its grammar's characters)."""


def _rebuilt_operand(uses: list[Use], expected: TreeType) -> str | None:
    """`%base {path: operand, ...}`: a subtree of one value with the leaves that differ overridden by their
    path (relative to the argument), or None where no subtree of one value has the expected structure."""
    base = _base(uses, expected.path_parts)
    if base is None:
        return None
    value, prefix = base
    if not all(_PLAIN_KEY.fullmatch(k) for path in expected.path_parts + (prefix,) for k in path):
        return None
    start = next(i for i, p in enumerate(_parts(value)) if p[: len(prefix)] == prefix)
    base_uses = [Use(value, start + i) for i in range(len(uses))]
    name = f"%{value.name}" + "".join(f".{p}" for p in prefix)
    return f"{name} {{{', '.join(_overrides(uses, base_uses, expected.path_parts))}}}"


def _base(uses: list[Use], paths: tuple[tuple[str, ...], ...]) -> tuple[Value, tuple[str, ...]] | None:
    """The (value, subtree path) whose leaves are these leaves at the most positions, where its subtree has
    exactly the expected leaf paths; None where there is none."""
    votes: dict[tuple[Value, tuple[str, ...]], int] = {}
    for u, rel in zip(uses, paths):
        full = _parts(u.value)[u.index]
        if len(full) >= len(rel) and full[len(full) - len(rel):] == rel:
            key = (u.value, full[: len(full) - len(rel)])
            votes[key] = votes.get(key, 0) + 1
    for value, prefix in sorted(votes, key=lambda k: -votes[k]):  # stable: the first seen wins a tie
        under = [p[len(prefix):] for p in _parts(value) if p[: len(prefix)] == prefix]
        if tuple(under) == tuple(paths):
            return value, prefix
    return None


def _overrides(uses: list[Use], base: list[Use], paths: tuple[tuple[str, ...], ...]) -> list[str]:
    """`path: operand` for the leaves that differ from the base, in order; a subtree whose leaves all differ
    is named by its shortest path where one operand names them."""
    out, i = [], 0
    while i < len(uses):
        if uses[i] == base[i]:
            i += 1
            continue
        path, end = _override_span(uses, base, paths, i)
        out.append(f"{'.'.join(path)}: {operand(uses[i:end])}")
        i = end
    return out


def _override_span(uses: list[Use], base: list[Use], paths: tuple[tuple[str, ...], ...],
                   i: int) -> tuple[tuple[str, ...], int]:
    """The shortest path from leaf `i` down whose leaves start at `i`, all differ from the base and are named
    by one operand -> (that path, the end of its leaves); the leaf's own path where no shorter one is."""
    for k in range(1, len(paths[i])):
        prefix = paths[i][:k]
        end = i
        while end < len(paths) and paths[end][:k] == prefix:
            end += 1
        if (i == 0 or paths[i - 1][:k] != prefix) and all(uses[j] != base[j] for j in range(i, end)) \
                and not operand(uses[i:end]).startswith("["):
            return prefix, end
    return paths[i], i + 1


def _leaf_name(use: Use) -> str:
    """`%v.path.to.leaf`; `%v` where the value is one bare leaf."""
    path = _parts(use.value)[use.index]
    return f"%{use.value.name}" + "".join(f".{p}" for p in path)


def _subtree_name(value: Value, indices: list[int], expected: TreeType | None) -> str | None:
    parts = _parts(value)
    chosen = [parts[i] for i in indices]
    prefix = chosen[0]
    for p in chosen[1:]:
        prefix = prefix[: next((k for k, (a, b) in enumerate(zip(prefix, p)) if a != b), min(len(prefix), len(p)))]
    under = [i for i, p in enumerate(parts) if p[: len(prefix)] == prefix]
    if under != indices:
        return None
    if expected is not None and len(indices) == len(parts) and expected.treedef != value.type.treedef:
        return None
    return f"%{value.name}" + "".join(f".{p}" for p in prefix)


def _parts(value: Value) -> tuple[tuple[str, ...], ...]:
    return value.type.path_parts


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
