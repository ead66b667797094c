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

from .errors import FragcError
from .host import HostStep
from .sweep import PBT
from .module import (
    Delay, For, FragmentDef, Glue, Graph, If, Loop, Mesh, Module, Placement, Run, Schedule, Stage, Transfer, Use,
    Value, walk,
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
    shape, axis = [], None
    for i, dim in enumerate(d for d in m["dims"].split(",") if d):
        if dim.endswith("@env"):
            dim, axis = dim[: -len("@env")], i
        shape.append(int(dim))
    return LeafType(tuple(shape), _dtype(m["dtype"]), axis, m["group"])


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
    """Type aliases (`type !Name = {...}`), resolved on first use (a field may name a later alias)."""

    def __init__(self) -> None:
        self.raw: dict[str, list[tuple[str, str]]] = {}
        self.trees: dict[str, Any] = {}

    def tree(self, text: str) -> Any:
        text = text.strip()
        if text == "()":
            return ()
        if not text.startswith("!"):
            return parse_leaf(text)
        name = text[1:]
        if name not in self.trees:
            if name not in self.raw:
                raise ParseError(f"unknown type alias !{name}")
            fields = [(tuple(path.split(".")), self.tree(t)) for path, t in self.raw[name]]
            self.trees[name] = _build(name, fields)
        return self.trees[name]

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


def parse(text: str, bodies: Module | None = None) -> Module:
    """The module `text` prints (see the module docstring for what it holds)."""
    lines = iter(text.splitlines())
    try:
        return _Parser(lines, bodies).module()
    except ParseError:
        raise
    except (ValueError, KeyError, IndexError, StopIteration) as err:
        raise ParseError(f"cannot parse the module: {type(err).__name__}: {err}") from err


class _Parser:
    def __init__(self, lines: Iterator[str], bodies: Module | None):
        self.lines = lines
        self.bodies = bodies
        self.types = _Types()
        self.values = _Values()
        self.fields: dict[str, Any] = {"meshes": [], "population": (), "carrier": None, "schedule": None,
                                       "hyperparameters": (), "member_loop": False, "pbt": None}
        self.fragments: dict[str, FragmentDef] = {}

    def module(self) -> Module:
        m = re.match(r"^// fragc\.ir · (.+) · after (.+)$", next(self.lines))
        if not m:
            raise ParseError("the first line is not a module header")
        name, label = m.groups()
        line = next(self.lines)
        while not line.startswith("func @iteration("):
            line = self.header_line(line)
        graph, stages = self.func(line)
        f = self.fields
        return Module(name, self.fragments, graph, label, meshes=tuple(f["meshes"]), population=f["population"],
                      carrier=f["carrier"], hyperparameters=f["hyperparameters"], member_loop=f["member_loop"],
                      pbt=f["pbt"], stages=tuple(stages), schedule=f["schedule"])

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
            self.fields["schedule"] = Schedule(m[1], int(m[2]))
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
        m = re.match(r"^fragment @([\w.]+) role=(\w+)(?: on @(\w+) (\w+) replicas=(\d+)"
                     r"(?: host_loop\(groups=(\d+)\))?(?: env_workers=(\d+))?)? eqns=\S+   // (.*)$", line)
        if not m:
            raise ParseError(f"not a fragment line: {line!r}")
        name, role, group, lowering, replicas, env_groups, env_workers, source = m.groups()
        sig = re.match(r"^    \((.*)\) -> \((.*)\)$", next(self.lines))
        if not sig:
            raise ParseError(f"fragment @{name}: no signature line")
        args = [a.partition(": ") for a in split_top(sig[1])]
        arg_names = tuple(a[0].lstrip("%") for a in args)
        in_types = tuple(self.types.type(a[2]) for a in args)
        out_types = tuple(self.types.type(t) for t in split_top(sig[2]))
        placement = Placement(group, int(replicas), lowering, int(env_groups or 0),
                              int(env_workers or 0)) if group else None
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

    def func(self, line: str) -> tuple[Graph, list[Stage]]:
        inputs = self.params(re.match(r"^func @iteration\((.*)\) \{$", line)[1])
        nodes, stages, text = self.block("return ")
        m = re.match(r"^return state=(.*), metrics=(.*)$", text)
        state_tree, state_uses = self.values.tree(m[1])
        metrics_tree, metrics_uses = self.values.tree(m[2])
        del state_tree  # the returned state has the input state's structure (the verifier checks it)
        out_tree = jax.tree.structure((jax.tree.unflatten(inputs[0].type.treedef, [0] * len(state_uses)),
                                       metrics_tree))
        return Graph(tuple(inputs), tuple(nodes), tuple(state_uses + metrics_uses), out_tree), stages

    def block(self, end: str) -> tuple[list[Any], list[Stage], str]:
        """Nodes and stages up to the line starting with `end` (`return `, `yield `) -> (nodes, stages, that line)."""
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
                return nodes, stages, text
            elif text:
                nodes.append(self.node(text))
        raise ParseError(f"a block has no {end.strip()}")

    def region_graph(self, line: str) -> tuple[str, Graph, tuple[Stage, ...], str]:
        """`^label(params):   // source`, nodes, `yield operands` -> (label, the graph, its stages, the source)."""
        line, _, source = line.partition("   // ")
        m = re.match(r"^\^(\w+)\((.*)\):$", line.strip())
        if not m:
            raise ParseError(f"a region does not start with ^label(...): {line.strip()!r}")
        inputs = self.params(m[2])
        nodes, stages, text = self.block("yield ")
        outputs = self.values.operands(text[len("yield "):])
        out_tree = jax.tree.structure(tuple(range(len(outputs))))
        return m[1], Graph(tuple(inputs), tuple(nodes), tuple(outputs), out_tree), tuple(stages), source.strip()

    def for_node(self, m: Any) -> For:
        _, body, stages, source = self.region_graph(next(self.lines))
        if next(self.lines).strip() != "}":
            raise ParseError("a for's body does not end with } after its yield")
        groups = [self.values.operands(m[k]) for k in (4, 5, 6)]
        trips, nk = int(m[2]), len(body.inputs[1].type.leaves)
        ys = tuple(u.type.stacked(trips) for u in body.outputs[nk:])
        names = [n.strip().lstrip("%") for n in m[1].split(",")]
        outs = (self.values.define(Value(names[0], body.inputs[1].type)),
                self.values.define(Value(names[1], _tree_type(ys))))
        return For(tuple(u for g in groups for u in g), outs, body, trips, bool(m[3]), source or "?", stages)

    def if_node(self, m: Any) -> If:
        leaves = self.types.type(m[2]).leaves
        inputs = tuple(self.values.uses(m[4]) + self.values.operands(m[5]))
        branches: dict[int, tuple[Graph, tuple[Stage, ...]]] = {}
        line, source = next(self.lines), ""
        while True:
            label, graph, stages, comment = self.region_graph(line)
            source = source or comment
            index = {"else": 0, "then": 1}.get(label)
            branches[int(label[len("case"):]) if index is None else index] = (graph, stages)
            line = next(self.lines).strip()
            if line == "}":
                break
            if line == "} else {":
                line = next(self.lines)
        order = sorted(branches)
        value = self.values.define(Value(m[1], _tree_type(leaves)))
        stages = tuple(branches[k][1] for k in order)
        return If(inputs, (value,), tuple(branches[k][0] for k in order), source or "?",
                  stages if any(stages) else ())

    def node(self, text: str) -> Any:
        text = text.partition("   // ")[0]
        if m := re.match(r"^(.*) = for trips=(\d+)( reverse)? consts\((.*?)\) carry\((.*?)\) xs\((.*)\) \{$", text):
            return self.for_node(m)
        if m := re.match(r"^%(\w+): (\S+) = (if|switch) (\S+) \((.*)\) \{$", text):
            return self.if_node(m)
        if m := re.match(r"^(.*) = loop @(\w+)\((.*)\) steps=(\d+)( reverse)? groups=(\d+) \{$", text):
            run = self.node(f"{m[1]} = run @{m[2]}({m[3]})")
            like = self._loop(m[2])
            return Loop(run.fragment, run.inputs, run.outputs, self.region(), int(m[4]), int(m[6]), bool(m[5]),
                        like and like.prefix, like and like.suffix)
        if m := re.match(r"^(.*) = run @([\w.]+)\((.*)\)$", text):
            fdef = self.fragments[m[2]]
            group = fdef.placement.group if fdef.placement else None
            outs = tuple(self.values.define(Value(n.strip().lstrip("%"), _on(t, group)))
                         for n, t in zip(m[1].split(","), fdef.out_types))
            return Run(m[2], tuple(self.values.operands(m[3])), outs)
        if m := re.match(r"^%(\w+): \((.*)\) = glue\((.*)\)$", text):
            leaves = tuple(parse_leaf(t) for t in split_top(m[2]))
            inputs = tuple(self.values.operands(m[3]))
            value = self.values.define(Value(m[1], _tree_type(leaves)))
            return Glue(self._glue_body(m[1]), inputs, (value,))
        if m := re.match(r"^%(\w+) = transfer (.*) @(\w+) -> @(\w+) via (\w+)$", text):
            inputs = tuple(self.values.uses(m[2]))
            value = self.values.define(Value(m[1], _tree_type(tuple(u.type.replace(group=m[4]) for u in inputs))))
            return Transfer(inputs, (value,), m[3], m[4], m[5])
        if m := re.match(r"^%(\w+) = delay (.*) init (.*?)(?: on @(\w+))?$", text):
            inputs, initial = tuple(self.values.uses(m[2])), tuple(self.values.uses(m[3]))
            value = self.values.define(Value(m[1], _tree_type(tuple(u.type.replace(group=m[4]) for u in inputs))))
            return Delay(inputs, initial, (value,))
        raise ParseError(f"not a node: {text!r}")

    def region(self) -> Graph:
        """A loop's region: `^step(params):`, its nodes, `yield operands`, then `}`."""
        m = re.match(r"^\^step\((.*)\):$", next(self.lines).strip())
        if not m:
            raise ParseError("a loop's region does not start with ^step(...):")
        inputs = []
        for p in split_top(m[1]):
            name, _, t = p.partition(": ")
            inputs.append(self.values.define(Value(name.lstrip("%"), self.types.type(t))))
        nodes = []
        for line in self.lines:
            text = line.strip()
            if text.startswith("yield "):
                outputs = self.values.operands(text[len("yield "):])
                if next(self.lines).strip() != "}":
                    raise ParseError("a loop's region does not end with } after its yield")
                n_carry = len(inputs[1].type.leaves)
                out_tree = jax.tree.structure((tuple(range(n_carry)), tuple(range(len(outputs) - n_carry))))
                return Graph(tuple(inputs), tuple(nodes), tuple(outputs), out_tree)
            nodes.append(self.node(text))
        raise ParseError("a loop's region has no yield")

    def _loop(self, fragment: str) -> Loop | None:
        """The loop node of `fragment` in the module bodies are taken from (its prefix and suffix)."""
        if self.bodies is None:
            return None
        return next((n for n in self.bodies.graph.nodes if isinstance(n, Loop) and n.fragment == fragment), None)

    def _glue_body(self, name: str) -> Any:
        if self.bodies is None:
            return None
        for node in walk(self.bodies.graph.nodes):
            if isinstance(node, Glue) and node.outputs[0].name == name:
                return node.body
        return None


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
