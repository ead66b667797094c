"""The verifier rejects hand-broken modules and names the node at fault."""

import dataclasses

import pytest

import fragc
from fragc.ir import Glue, Use, verify
from toy_algos import Regression


@pytest.fixture(scope="module")
def module():
    return fragc.trace(Regression())


def _with_nodes(module, nodes):
    return module.replace(graph=module.graph.replace(nodes=tuple(nodes)))


def test_traced_module_verifies(module):
    assert verify(module) is module


def test_use_before_definition(module):
    nodes = list(module.graph.nodes)
    broken = _with_nodes(module, [nodes[1], nodes[0], *nodes[2:]])
    with pytest.raises(fragc.VerifyError, match=r"001_trace: node 0 \(run @learn -> %learn_0, %learn_1\): uses %data before it is defined"):
        verify(broken)


def test_operand_of_the_wrong_type(module):
    """@learn(w, x, y): pass the state's first leaf (w, f32[3]) where y (f32[8]) belongs."""
    nodes = list(module.graph.nodes)
    learn = nodes[1]
    bad = learn.replace(inputs=(learn.inputs[0], learn.inputs[1], Use(module.graph.inputs[0], 0)))
    broken = _with_nodes(module, [nodes[0], bad, *nodes[2:]])
    with pytest.raises(fragc.VerifyError, match=r"node 1 \(run @learn -> %learn_0, %learn_1\): operand 2 is f32\[3\], but @learn expects f32\[8@env\]"):
        verify(broken)


def test_unknown_fragment(module):
    nodes = list(module.graph.nodes)
    broken = _with_nodes(module, [nodes[0].replace(fragment="nope"), *nodes[1:]])
    with pytest.raises(fragc.VerifyError, match=r"node 0 \(run @nope -> .*\): fragment @nope is not defined"):
        verify(broken)


def test_value_defined_twice(module):
    nodes = list(module.graph.nodes)
    twice = nodes[1].replace(outputs=(nodes[0].outputs[0], nodes[1].outputs[1]))
    broken = _with_nodes(module, [nodes[0], twice, *nodes[2:]])
    with pytest.raises(fragc.VerifyError, match=r"node 1 \(run @learn -> %sample_0, %learn_1\): value %sample_0 is defined twice"):
        verify(broken)


def test_glue_with_wrong_arity(module):
    glue = next(n for n in module.graph.nodes if isinstance(n, Glue))
    index = module.graph.nodes.index(glue)
    nodes = list(module.graph.nodes)
    nodes[index] = glue.replace(inputs=())
    with pytest.raises(fragc.VerifyError, match=rf"node {index} \(glue -> %g\): 0 operands for a body of 1 inputs"):
        verify(_with_nodes(module, nodes))


def test_returned_state_of_the_wrong_type(module):
    outputs = list(module.graph.outputs)
    outputs[0], outputs[1] = outputs[1], outputs[0]
    broken = module.replace(graph=module.graph.replace(outputs=tuple(outputs)))
    with pytest.raises(fragc.VerifyError, match=r"return: the returned state's types differ"):
        verify(broken)


def test_placed_operand_on_the_wrong_group(module):
    prog_module = fragc.compile(Regression(), "single").pipeline.after("insert_transfers")
    nodes = list(prog_module.graph.nodes)
    run = nodes[1]
    elsewhere = dataclasses.replace(run.inputs[1].value, type=run.inputs[1].value.type.with_leaves(
        tuple(t.replace(group="other") for t in run.inputs[1].value.type.leaves)))
    nodes[0] = nodes[0].replace(outputs=(nodes[0].outputs[0], elsewhere))
    nodes[1] = run.replace(inputs=(run.inputs[0], Use(elsewhere, 0), run.inputs[2]))
    with pytest.raises(fragc.VerifyError, match=r"node 1 \(run @learn .*\): operand 1 lives on @other, but @learn runs on @main"):
        verify(_with_nodes(prog_module, nodes))
