"""Graphviz DOT export of the iteration graph (`fragc ir --dot`)."""

from __future__ import annotations

from .module import For, Glue, HostLoop, If, Module, RegionNode, Run, Transfer, While, fragments_run_in

_SHAPES = {"run": "box", "glue": "ellipse", "transfer": "cds", "delay": "diamond", "loop": "box3d", "for": "box3d",
           "while": "box3d", "if": "hexagon"}


def to_dot(module: Module) -> str:
    graph = module.graph
    lines = [f'digraph "{module.name}" {{', "  rankdir=TB;", '  node [fontname="monospace"];']
    producer = {v: f"n{i}" for v, i in graph.producers().items()}
    for v in graph.inputs:
        producer[v] = f"in_{v.name}"
        lines.append(f'  in_{v.name} [shape=plaintext, label="%{v.name}"];')
    groups: dict[str | None, list[str]] = {}
    for i, node in enumerate(graph.nodes):
        label, group = _label(module, node)
        groups.setdefault(group, []).append(f'  n{i} [shape={_SHAPES[node.kind]}, label="{label}"];')
    for group, node_lines in groups.items():
        if group is None:
            lines += node_lines
        else:
            lines += [f"  subgraph cluster_{group} {{", f'    label="@{group}";', *node_lines, "  }"]
    for i, node in enumerate(graph.nodes):
        for value in dict.fromkeys(u.value for u in node.operands):
            lines.append(f'  {producer[value]} -> n{i} [label="%{value.name}"];')
    lines.append('  out [shape=plaintext, label="return"];')
    for value in dict.fromkeys(u.value for u in graph.outputs):
        lines.append(f'  {producer[value]} -> out [label="%{value.name}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _label(module: Module, node: object) -> tuple[str, str | None]:
    if isinstance(node, HostLoop):  # its step's runs on one line
        group = module.fragments[node.fragment].placement.group
        runs = " -> ".join(n.fragment.rpartition(".")[2] for n in node.body.nodes if isinstance(n, Run))
        return f"loop @{node.fragment}\\nsteps={node.steps} groups={node.groups}\\n{runs}", group
    if isinstance(node, RegionNode):  # a region on one node: what it is and the fragments it runs
        head = {For: lambda: f"for trips={node.trips}", While: lambda: "while",
                If: lambda: f"if ({len(node.branches)} branches)"}[type(node)]()
        runs = " ".join(f"@{name}" for name in fragments_run_in((node,)))
        return f"{head}\\n{runs}\\n{node.source}", module.group_of(node)
    if isinstance(node, Run):
        fdef = module.fragments[node.fragment]
        group = fdef.placement.group if fdef.placement else None
        return f"@{fdef.name}\\nrole={fdef.role}", group
    if isinstance(node, Glue):
        return f"glue ({len(node.body.jaxpr.eqns)} eqns)", None
    if isinstance(node, Transfer):
        return f"transfer @{node.src} -> @{node.dst}", None
    return node.kind, None
