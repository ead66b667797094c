"""Pass infrastructure: verification after every pass, naming the failing pass."""

import dataclasses

import numpy as np
import pytest
from jax.sharding import Mesh

import jax
import fragc
from fragc.passes import Canonicalize, Pass, PassError, run_pipeline
from toy_algos import Regression


@dataclasses.dataclass(frozen=True)
class DropFirstNode(Pass):
    """A broken pass: removes the first node, leaving its uses dangling."""

    name = "drop_first"

    def run(self, module):
        return module.replace(graph=module.graph.replace(nodes=module.graph.nodes[1:]))


def test_a_pass_that_breaks_the_module_is_named_with_the_passes_before_it():
    with pytest.raises(PassError, match=r"pass 'drop_first' failed \(after 001_trace, 002_canonicalize\): "
                                        r"003_drop_first: node 0 \(run @learn .*\): uses %data before it is defined"):
        run_pipeline(fragc.trace(Regression()), [Canonicalize(), DropFirstNode()])


def test_pass_options_appear_in_the_module_label():
    from fragc.passes import DispatchLoop

    result = run_pipeline(fragc.trace(Regression()), [Canonicalize(), DispatchLoop(k=4)])
    assert [m.label for m in result.modules] == ["001_trace", "002_canonicalize", "003_loop{k=4}"]


def test_canonicalize_drops_dead_glue_and_fragments():
    class Dead(Regression):
        def iteration(self, state):
            new_state, metrics = super().iteration(state)
            self.sample(state.data)  # result unused
            _ = state.step * 7  # dead glue
            return new_state, metrics

    module = fragc.trace(Dead())
    canon = Canonicalize().run(module)
    assert len(canon.graph.nodes) < len(module.graph.nodes)
    state = Dead().init(jax.random.key(0))
    a, b = fragc.interpret(module, state), fragc.interpret(canon, state)
    np.testing.assert_allclose(a[0].w, b[0].w)


def test_compile_on_a_given_mesh():
    mesh = Mesh(np.array(jax.devices()[2:6]), ("x",))
    prog = fragc.compile(Regression(), "anakin", mesh=mesh)
    assert prog.devices == jax.devices()[2:6]
    assert "replicas=4" in prog.ir()
