"""`parse(text)`: read back what the printer writes (grammar in docs/ir.md).

The printed form holds the graph, the types (structure as key paths, shapes,
dtypes, batch axes, groups), fragment signatures and placements, meshes,
stages, the schedule, the population and the transfers' carrier. It does not
hold fragment or glue bodies (JAX's IR, printed only with `--bodies`), nor the
Python classes of pytrees: a type reads back as `Record` nodes named after its
alias, with its fields in printed order, so it prints the same again. Pass
`bodies=` a module of the same trace to take fragment and glue bodies from it
(fragments by name, glue by its result's name).
"""

from __future__ import annotations

import functools
import re
from typing import Any, Iterator

import jax
import numpy as np
from jax.extend import core as jex

from .errors import FragcError
from .graph_builder import glue_debug_info
from .printer import alias_types
from .host import HostStep
from .sweep import PBT
from .module import (
    Delay, For, FragmentDef, Glue, Graph, GraphPath, HostLoop, If, Mesh, Module, Placement, Run, Schedule, Stage,
    Transfer, Use, Value, While, walk,
)
from .types import _SHORT_DTYPES, LeafType, TreeType

_DTYPES = {short: np.dtype(name) for name, short in _SHORT_DTYPES.items() if name != "bfloat16"}
_LEAF = re.compile(r"^(?P<dtype>[\w<>]+)\[(?P<dims>[^\]]*)\](?:@(?P<group>\w+))?$")


class ParseError(FragcError):
    """The text is not a printed module; the message names the line."""


class Record:
    """A pytree node read back from text: named fields in printed order."""

    def __init__(self, keys: tuple[str, ...], children: list[Any]):
        self.keys, self.children = keys, children


def _flatten_with_keys(r: Record):
    return [(jax.tree_util.GetAttrKey(k), c) for k, c in zip(r.keys, r.children)], r.keys


jax.tree_util.register_pytree_with_keys(Record, _flatten_with_keys, lambda keys, children: Record(keys, list(children)),
                                        lambda r: (r.children, r.keys))


@functools.cache
def record_class(name: str) -> type:
    """A `Record` subclass named after a type alias, so the alias prints under its own name again."""
    cls = type(name, (Record,), {})
    jax.tree_util.register_pytree_with_keys(cls, _flatten_with_keys, lambda keys, children: cls(keys, list(children)),
                                            lambda r: (r.children, r.keys))
    return cls


# ---------------------------------------------------------------- types


def parse_leaf(text: str) -> LeafType:
    m = _LEAF.match(text.strip())
    if not m:
        raise ParseError(f"not a leaf type: {text!r}")
    shape, axis, agent = [], None, None
    for i, dim in enumerate(d for d in m["dims"].split(",") if d):
        if dim.endswith("@env"):
            dim, axis = dim[: -len("@env")], i
        elif dim.endswith("@agent"):
            dim, agent = dim[: -len("@agent")], i
        shape.append(int(dim))
    return LeafType(tuple(shape), _dtype(m["dtype"]), axis, m["group"], agent)


def _dtype(name: str) -> Any:
    if name in _DTYPES:
        return _DTYPES[name]
    if name in _key_dtypes():
        return _key_dtypes()[name]
    raise ParseError(f"unknown dtype {name!r}")


@functools.cache
def _key_dtypes() -> dict[str, Any]:
    """Typed PRNG key dtypes by printed name (`key<fry>` is threefry2x32's)."""
    out = {}
    for impl in ("threefry2x32", "rbg", "unsafe_rbg"):
        dtype = jax.eval_shape(lambda: jax.random.key(0, impl=impl)).dtype  # noqa: B023
        out[str(dtype)] = dtype
    return out


def _tree_type(tree: Any) -> TreeType:
    """A tree whose leaves are `LeafType`s -> its `TreeType`."""
    leaves, treedef = jax.tree.flatten(tree, is_leaf=lambda x: isinstance(x, LeafType))
    return TreeType(treedef, tuple(leaves))


def _build(name: str | None, fields: list[tuple[tuple[str, ...], Any]]) -> Any:
    """Nested nodes from (path, subtree) pairs in order: digit keys make tuples, others Records."""
    if len(fields) == 1 and fields[0][0] == ():
        return fields[0][1]
    children: dict[str, list] = {}
    for path, sub in fields:
        children.setdefault(path[0], []).append((path[1:], sub))
    keys = tuple(children)
    built = [_build(None, rest) for rest in children.values()]
    if name is None and all(k.isdigit() for k in keys) and list(keys) == [str(i) for i in range(len(keys))]:
        return tuple(built)
    return (record_class(name) if name else Record)(keys, built)


class _Types:
    """Type aliases (`type !Name = {...}`), resolved on first use (a field may name a later alias). `known`: the
    types a module of the same trace names so (`alias_types`): an alias that reads back with the same leaf paths
    takes its pytree classes from there."""

    def __init__(self, known: dict[str, TreeType] | None = None) -> None:
        self.raw: dict[str, list[tuple[str, str]]] = {}
        self.trees: dict[str, Any] = {}
        self.known = known or {}

    def tree(self, text: str) -> Any:
        text = text.strip()
        if text == "()":
            return ()
        if not text.startswith("!"):
            return parse_leaf(text)
        if "@" in text:  # `!Params@learner`: the alias with every leaf on that group
            name, _, group = text.partition("@")
            return jax.tree.map(lambda leaf: leaf.replace(group=group), self.tree(name),
                                is_leaf=lambda x: isinstance(x, LeafType))
        name = text[1:]
        if name not in self.trees:
            if name not in self.raw:
                raise ParseError(f"unknown type alias !{name}")
            fields = [(tuple(path.split(".")), self.tree(t)) for path, t in self.raw[name]]
            self.trees[name] = self._classes(name, _build(name, fields))
        return self.trees[name]

    def _classes(self, name: str, tree: Any) -> Any:
        """`tree` with the pytree classes of the known type of the same alias, where their leaf paths agree."""
        known = self.known.get(name)
        if known is None:
            return tree
        read = _tree_type(tree)
        if read.path_parts != known.path_parts:
            return tree
        return jax.tree.unflatten(known.treedef, list(read.leaves))

    def type(self, text: str) -> TreeType:
        return _tree_type(self.tree(text))


# ---------------------------------------------------------------- operands


def split_top(text: str, sep: str = ",") -> list[str]:
    """Split at `sep` outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    last = text[start:].strip()
    return parts + [last] if last or parts else []


class _Values:
    def __init__(self) -> None:
        self.by_name: dict[str, Value] = {}

    def define(self, value: Value) -> Value:
        self.by_name[value.name] = value
        return value

    def uses(self, text: str) -> list[Use]:
        """The leaves an operand names: `%v`, `%v.a.b`, `%v#3`, `[op, ...]`, `%base {path: op, ...}` or `()`."""
        text = text.strip()
        if text == "()":
            return []
        if text.startswith("["):
            return [u for part in split_top(text[1:-1]) for u in self.uses(part)]
        if " {" in text:
            return self.rebuilt(text)
        name, _, index = text[1:].partition("#")
        name, *path = name.split(".")
        value = self.by_name.get(name)
        if value is None:
            raise ParseError(f"operand %{name} is not defined")
        if index:
            first, _, last = index.partition("..")
            return [Use(value, i) for i in range(int(first), int(last or first) + 1)]
        parts = value.type.path_parts
        picked = [Use(value, i) for i, p in enumerate(parts) if list(p[: len(path)]) == path]
        if not picked:
            raise ParseError(f"%{name} has no leaves under '{'.'.join(path)}'")
        return picked

    def rebuilt(self, text: str) -> list[Use]:
        """`%base {path: op, ...}`: the base's leaves, those under each path (relative to the base) replaced by
        the operand's, in order."""
        base, _, body = text.partition(" {")
        if not body.endswith("}"):
            raise ParseError(f"an override operand does not end with }}: {text!r}")
        leaves = self.uses(base)
        skip = len(base.split(".")) - 1  # the base's own path
        paths = [u.value.type.path_parts[u.index][skip:] for u in leaves]
        for override in split_top(body[:-1]):
            key, _, sub = override.partition(": ")
            path = tuple(key.split("."))
            at = [i for i, p in enumerate(paths) if p[: len(path)] == path]
            new = self.uses(sub)
            if not at or len(new) != len(at):
                raise ParseError(f"{base} has no {len(new)} leaves under '{key}' to override in {text!r}")
            leaves[at[0] : at[-1] + 1] = new
        return leaves

    def operands(self, text: str) -> list[Use]:
        return [u for part in split_top(text) for u in self.uses(part)]

    def tree(self, text: str) -> tuple[Any, list[Use]]:
        """A returned tree: `{key: tree, ...}` or an operand -> (structure with placeholder leaves, leaves)."""
        text = text.strip()
        if text in ("()", "{}"):  # no leaves
            return ({} if text == "{}" else ()), []
        if text.startswith("{"):
            keys, children, uses = [], [], []
            for part in split_top(text[1:-1]):
                key, _, sub = part.partition(": ")
                tree, sub_uses = self.tree(sub)
                keys.append(key)
                children.append(tree)
                uses += sub_uses
            return Record(tuple(keys), children), uses
        return self.structure(text), self.uses(text)

    def structure(self, text: str) -> Any:
        """The pytree structure (placeholder leaves) of the leaves an operand names (an override operand's is its
        base's)."""
        if text.startswith("["):
            return [0] * len(self.uses(text))
        if " {" in text:
            return self.structure(text.partition(" {")[0])
        name, _, index = text[1:].partition("#")
        if index:
            return 0
        name, *path = name.split(".")
        value = self.by_name[name]
        tree = jax.tree.unflatten(value.type.treedef, [0] * len(value.type.leaves))
        for key in path:
            tree = _child(tree, key)
        return tree


# ---------------------------------------------------------------- the module


def parse(text: str, bodies: Module | None = None, glue: dict[str, Any] | None = None) -> Module:
    """The module `text` prints (see the module docstring for what it holds).

    glue: bodies for glue nodes by their result's name, where `bodies` has none (glue written by hand into the
      text): a function of the glue's operand leaves, traced at their types, or a `ClosedJaxpr`.
    """
    lines = iter(text.splitlines())
    try:
        return _Parser(lines, bodies, glue or {}).module()
    except ParseError:
        raise
    except (ValueError, KeyError, IndexError, StopIteration) as err:
        raise ParseError(f"cannot parse the module: {type(err).__name__}: {err}") from err


class _Parser:
    def __init__(self, lines: Iterator[str], bodies: Module | None, glue: dict[str, Any]):
        self.lines = lines
        self.bodies = bodies
        self.glue = glue
        self.types = _Types(alias_types(bodies) if bodies is not None else None)
        self.values = _Values()
        self.fields: dict[str, Any] = {"meshes": [], "population": (), "carrier": None, "schedule": None,
                                       "hyperparameters": (), "member_loop": False, "pbt": None}
        self.fragments: dict[str, FragmentDef] = {}
        self.stages: dict[GraphPath, tuple[Stage, ...]] = {}  # per graph, as the stage blocks say

    def module(self) -> Module:
        m = re.match(r"^// fragc\.ir · (.+) · after (.+)$", next(self.lines))
        if not m:
            raise ParseError("the first line is not a module header")
        name, label = m.groups()
        line = next(self.lines)
        while not line.startswith("func @iteration("):
            line = self.header_line(line)
        graph = self.func(line)
        f = self.fields
        schedule = f["schedule"]
        if self.stages:
            schedule = (schedule or Schedule()).replace(stages=tuple(sorted(self.stages.items())))
        return Module(name, self.fragments, graph, label, meshes=tuple(f["meshes"]), population=f["population"],
                      carrier=f["carrier"], hyperparameters=f["hyperparameters"], member_loop=f["member_loop"],
                      pbt=f["pbt"], schedule=schedule)

    def header_line(self, line: str) -> str:
        """One top-level line (and the lines that belong to it) -> the next top-level line."""
        if m := re.match(r"^mesh @(\w+) = devices\[(.*)\]$", line):
            self.fields["meshes"].append(Mesh(m[1], _ranges(m[2])))
        elif m := re.match(r"^population( loop)? seeds=\[([^\]]*)\]((?: \w+=\[[^\]]*\])*)$", line):
            self.fields["member_loop"] = bool(m[1])
            self.fields["population"] = tuple(int(x) for x in m[2].split(","))
            self.fields["hyperparameters"] = tuple(
                (name, tuple(_number(x) for x in values.split(",")))
                for name, values in re.findall(r" (\w+)=\[([^\]]*)\]", m[3]))
        elif m := re.match(r"^pbt every=(\d+) metric=(\S+) fraction=(\S+) resample=(\S+) seed=(\d+)(?: bounds=(\S+))?$",
                           line):
            bounds = tuple((f, float(lo), float(hi)) for f, lo, hi in (b.split(":") for b in m[6].split(","))) \
                if m[6] else ()
            self.fields["pbt"] = PBT(int(m[1]), m[2], float(m[3]), float(m[4]), int(m[5]), bounds)
        elif m := re.match(r"^transfers via (\w+)$", line):
            self.fields["carrier"] = m[1]
        elif m := re.match(r"^schedule (\w+) iterations_per_dispatch=(\d+)$", line):
            self.fields["schedule"] = Schedule(m[1], int(m[2]))  # the executor, k
        elif m := re.match(r"^type !(\w+) = \{", line):
            fields = []
            for field in self.lines:
                if field == "}":
                    break
                path, _, t = field.strip().rstrip(",").partition(": ")
                fields.append((path, t))
            self.types.raw[m[1]] = fields
        elif line.startswith("fragment @"):
            return self.fragment(line)
        elif line.strip():
            raise ParseError(f"unexpected line: {line!r}")
        return next(self.lines)

    def fragment(self, line: str) -> str:
        m = re.match(r"^fragment @([\w.]+) role=(\w+)(?: on @(\w+) (\w+) replicas=(\d+)(?: split=(agent))?"
                     r"(?: host_loop\(groups=(\d+)\))?(?: env_workers=(\d+))?(?: env_fleet=(\S+))?)? eqns=\S+   // (.*)$",
                     line)
        if not m:
            raise ParseError(f"not a fragment line: {line!r}")
        name, role, group, lowering, replicas, split, env_groups, env_workers, env_fleet, source = m.groups()
        sig = re.match(r"^    \((.*)\) -> \((.*)\)$", next(self.lines))
        if not sig:
            raise ParseError(f"fragment @{name}: no signature line")
        args = [a.partition(": ") for a in split_top(sig[1])]
        arg_names = tuple(a[0].lstrip("%") for a in args)
        in_types = tuple(self.types.type(a[2]) for a in args)
        out_types = tuple(self.types.type(t) for t in split_top(sig[2]))
        placement = Placement(group, int(replicas), lowering, int(env_groups or 0),
                              int(env_workers or 0), env_fleet or "", split or "env") if group else None
        like = self.bodies.fragments.get(name) if self.bodies is not None else None
        if like is not None:  # its body (and the function it traces), with the types as read
            fdef = like.replace(in_types=in_types, out_types=out_types, placement=placement)
        else:
            fdef = FragmentDef(
                name, role, None, arg_names, _structure(in_types), _structure(out_types),
                tuple(t.axis for tt in in_types for t in tt.leaves), tuple(t.axis for tt in out_types for t in tt.leaves),
                in_types, out_types, None, source, placement)
        line = next(self.lines)
        host_steps = []
        while line.startswith("    "):  # host steps, then a printed body
            if (step := HostStep.parse_line(line.strip())) is not None:
                host_steps.append(step)
            line = next(self.lines)
        self.fragments[name] = fdef.replace(host_steps=tuple(host_steps), part_of=name.rpartition(".")[0])
        return line

    def params(self, text: str) -> list[Value]:
        """`%a: T, %b: U` -> the values they define."""
        values = []
        for p in split_top(text):
            name, _, t = p.partition(": ")
            values.append(self.values.define(Value(name.lstrip("%"), self.types.type(t))))
        return values

    def func(self, line: str) -> Graph:
        inputs = self.params(re.match(r"^func @iteration\((.*)\) \{$", line)[1])
        nodes, text = self.block("return ", ())
        for line in self.lines:  # a return wrapped over lines: its continuations, up to the function's end
            if line.strip() == "}":
                break
            text += " " + line.strip()
        m = re.match(r"^return state=(.*), metrics=(.*)$", text)
        state_tree, state_uses = self.values.tree(m[1])
        metrics_tree, metrics_uses = self.values.tree(m[2])
        del state_tree  # the returned state has the input state's structure (the verifier checks it)
        out_tree = jax.tree.structure((jax.tree.unflatten(inputs[0].type.treedef, [0] * len(state_uses)),
                                       metrics_tree))
        if self.bodies is not None and _same_paths(self.bodies.graph.out_tree, out_tree):
            out_tree = self.bodies.graph.out_tree  # the metrics' own pytree classes
        return Graph(tuple(inputs), tuple(nodes), tuple(state_uses + metrics_uses), out_tree)

    def block(self, end: str, path: GraphPath) -> tuple[list[Any], str]:
        """The nodes of the graph at `path` up to the line starting with `end` (`return `, `yield `) -> (nodes, that
        line); its stage blocks into `self.stages`."""
        nodes, stages, open_stage = [], [], None
        for line in self.lines:
            text = line.strip()
            if m := re.match(r"^stage @(\w+) on @(\w+)\((.*)\) \{$", text):
                open_stage = (m[1], m[2], self.values.operands(m[3]), len(nodes))
            elif m := re.match(r"^\} -> \((.*)\)$", text):
                name, group, ins, start = open_stage
                stages.append(Stage(name, group, tuple(range(start, len(nodes))), tuple(ins),
                                    tuple(self.values.operands(m[1]))))
                open_stage = None
            elif text.startswith(end):
                if stages:
                    self.stages[path] = tuple(stages)
                return nodes, text
            elif text:
                nodes.append(self.node(text, path + (len(nodes),)))
        raise ParseError(f"a block has no {end.strip()}")

    def regions(self, at: GraphPath, labels: dict[str, int]) -> tuple[list[Graph], str]:
        """The regions of a region node at `at` (its graph's path and its index), each `^label(params):   //
        source`, its nodes and `yield operands`, separated by `} word {` lines or none, up to the node's `}` ->
        (the graphs by region index, the first region's source)."""
        graphs: dict[int, Graph] = {}
        line, source = next(self.lines), ""
        while True:
            line, _, comment = line.partition("   // ")
            m = re.match(r"^\^(\w+)\((.*)\):$", line.strip())
            if not m or m[1] not in labels:
                raise ParseError(f"a region does not start with one of ^{', ^'.join(labels) or 'caseN'}: "
                                 f"{line.strip()!r}")
            k = labels[m[1]]
            source = source or comment.strip()
            inputs = self.params(m[2])
            nodes, text = self.block("yield ", at + (k,))
            outputs = self.values.operands(text[len("yield "):])
            graphs[k] = Graph(tuple(inputs), tuple(nodes), tuple(outputs), jax.tree.structure(tuple(range(len(outputs)))))
            line = next(self.lines)
            if line.strip() == "}":
                break
            if re.match(r"^\} \w+ \{$", line.strip()):
                line = next(self.lines)
        count = len(labels) or len(graphs)  # a switch has as many branches as it prints
        if sorted(graphs) != list(range(count)):
            raise ParseError(f"a region node holds regions {sorted(graphs)}, not {list(range(count))}")
        return [graphs[k] for k in range(count)], source

    def node(self, text: str, at: GraphPath) -> Any:
        """One node (a region node with its regions, from the following lines); `at`: where it lies."""
        text = text.partition("   // ")[0]
        for pattern, parse_region_node in REGION_NODES:
            if m := re.match(pattern, text):
                return parse_region_node(self, m, at)
        if m := re.match(r"^(.*) = run @([\w.]+)\((.*)\)$", text):
            return self.run(m[1], m[2], m[3])
        if m := re.match(r"^%(\w+): \((.*)\) = glue\((.*)\)$", text):
            leaves = tuple(parse_leaf(t) for t in split_top(m[2]))
            inputs = tuple(self.values.operands(m[3]))
            value = self.values.define(Value(m[1], _tree_type(leaves)))
            return Glue(self._glue_body(m[1], inputs), inputs, (value,))
        if m := re.match(r"^%(\w+) = transfer (.*) @(\w+) -> @(\w+) via (\w+)$", text):
            inputs = tuple(self.values.uses(m[2]))
            value = self.values.define(Value(m[1], _tree_type(tuple(u.type.replace(group=m[4]) for u in inputs))))
            return Transfer(inputs, (value,), m[3], m[4], m[5])
        if m := re.match(r"^%(\w+) = delay (.*) init (.*?)(?: on @(\w+))?$", text):
            inputs, initial = tuple(self.values.uses(m[2])), tuple(self.values.uses(m[3]))
            value = self.values.define(Value(m[1], _tree_type(tuple(u.type.replace(group=m[4]) for u in inputs))))
            return Delay(inputs, initial, (value,))
        raise ParseError(f"not a node: {text!r}")

    def run(self, outs: str, fragment: str, args: str) -> Run:
        fdef = self.fragments[fragment]
        group = fdef.placement.group if fdef.placement else None
        values = tuple(self.values.define(Value(n.strip().lstrip("%"), _on(t, group)))
                       for n, t in zip(outs.split(","), fdef.out_types))
        return Run(fragment, tuple(self.values.operands(args)), values)

    # ------------------------------------------------------------ region nodes, one reader a kind

    def for_node(self, m: Any, at: GraphPath) -> For:
        inputs = [u for k in (5, 6, 7) for u in self.values.operands(m[k] or "")]
        (body,), source = self.regions(at, {"trip": 0})
        trips, nk = int(m[2]), len(body.inputs[1].type.leaves)
        ys = tuple(u.type.stacked(trips) for u in body.outputs[nk:])
        names = [n.strip().lstrip("%") for n in m[1].split(",")]
        outs = (self.values.define(Value(names[0], body.inputs[1].type)),
                self.values.define(Value(names[1], _tree_type(ys))))
        return For(tuple(inputs), outs, body, trips, bool(m[3]), source or "?", int(m[4] or 1))

    def while_node(self, m: Any, at: GraphPath) -> While:
        inputs = [u for k in (2, 3, 4) for u in self.values.operands(m[k] or "")]
        (cond, body), source = self.regions(at, {"cond": 0, "body": 1})
        value = self.values.define(Value(m[1].strip().lstrip("%"), body.inputs[1].type))
        return While(tuple(inputs), (value,), cond, body, source or "?")

    def if_node(self, m: Any, at: GraphPath) -> If:
        leaves = self.types.type(m[2]).leaves
        inputs = tuple(self.values.uses(m[4]) + self.values.operands(m[5]))
        labels = {"else": 0, "then": 1} if m[3] == "if" else None
        branches, source = self.regions(at, labels or _CaseLabels())
        value = self.values.define(Value(m[1], _tree_type(leaves)))
        return If(inputs, (value,), tuple(branches), source or "?")

    def loop_node(self, m: Any, at: GraphPath) -> HostLoop:
        inputs = tuple(self.values.operands(m[3]))
        (step,), _ = self.regions(at, {"step": 0})
        run = self.run(m[1], m[2], m[3])
        like = self._loop(m[2])
        nk = len(step.inputs[1].type.leaves)
        step = step.replace(out_tree=jax.tree.structure((tuple(range(nk)), tuple(range(len(step.outputs) - nk)))))
        return HostLoop(run.fragment, inputs, run.outputs, step, int(m[4]), int(m[6]), bool(m[5]),
                        like and like.prefix, like and like.suffix)

    def _loop(self, fragment: str) -> HostLoop | None:
        """The loop node of `fragment` in the module bodies are taken from (its prefix and suffix)."""
        if self.bodies is None:
            return None
        return next((n for n in self.bodies.graph.nodes if isinstance(n, HostLoop) and n.fragment == fragment), None)

    def _glue_body(self, name: str, inputs: tuple[Use, ...]) -> Any:
        """The body of glue `%name`: given by hand (`glue=`), else the same-named glue's of `bodies`."""
        if name in self.glue:
            given = self.glue[name]
            if isinstance(given, jex.ClosedJaxpr):
                return given
            body = jax.make_jaxpr(lambda *xs: tuple(jax.tree.leaves(given(*xs))))(*[u.type.struct() for u in inputs])
            return jex.ClosedJaxpr(body.jaxpr.replace(debug_info=glue_debug_info(len(inputs), len(body.out_avals))),
                                   body.consts)
        if self.bodies is None:
            return None
        for node in walk(self.bodies.graph.nodes):
            if isinstance(node, Glue) and node.outputs[0].name == name:
                return node.body
        return None


def _same_paths(a: Any, b: Any) -> bool:
    """Whether two treedefs have the same leaves under the same printed key paths."""
    def paths(tree: Any) -> list[str]:
        flat = jax.tree_util.tree_flatten_with_path(jax.tree.unflatten(tree, [0] * tree.num_leaves))[0]
        return [jax.tree_util.keystr(p, simple=True, separator=".") for p, _ in flat]
    return a.num_leaves == b.num_leaves and paths(a) == paths(b)


class _CaseLabels(dict):
    """`^case0`, `^case1`, ...: a switch's branches by index, however many."""

    def __contains__(self, label: object) -> bool:
        return isinstance(label, str) and re.fullmatch(r"case\d+", label) is not None

    def __getitem__(self, label: str) -> int:
        return int(label[len("case"):])

    def __len__(self) -> int:
        return 0


REGION_NODES = (
    (r"^(.*) = for trips=(\d+)( reverse)?(?: unroll=(\d+))?(?: consts\((.*?)\))? carry\((.*?)\)(?: xs\((.*)\))? \{$",
     _Parser.for_node),
    (r"^(.*) = while(?: consts\((.*?)\))?(?: body_consts\((.*?)\))? carry\((.*)\) \{$", _Parser.while_node),
    (r"^%(\w+): (\S+) = (if|switch) (\S+) \((.*)\) \{$", _Parser.if_node),
    (r"^(.*) = loop @([\w.]+)\((.*)\) steps=(\d+)( reverse)? groups=(\d+) \{$", _Parser.loop_node),
)
"""Per region kind, the head line it prints and how to read the node from it and its regions."""


def _structure(types: tuple[TreeType, ...]) -> Any:
    """The treedef of a tuple of values of these types."""
    return jax.tree.structure(tuple(jax.tree.unflatten(t.treedef, [0] * len(t.leaves)) for t in types))


def _child(tree: Any, key: str) -> Any:
    """The child of a pytree node under a printed key (field, dict key or index)."""
    if isinstance(tree, Record):
        return tree.children[tree.keys.index(key)]
    if isinstance(tree, (tuple, list)):
        return tree[int(key)]
    if isinstance(tree, dict):
        return next(v for k, v in tree.items() if str(k) == key)
    return getattr(tree, key)


def _on(t: TreeType, group: str | None) -> TreeType:
    return t.with_leaves(tuple(leaf.replace(group=group) for leaf in t.leaves))


def _ranges(text: str) -> tuple[int, ...]:
    if ".." in text:
        a, b = text.split("..")
        return tuple(range(int(a), int(b) + 1))
    return tuple(int(x) for x in text.split(","))


def _number(text: str) -> int | float:
    """A hyperparameter value as the printer wrote it (`repr` of an int or a float)."""
    text = text.strip()
    return int(text) if re.fullmatch(r"-?\d+", text) else float(text)
