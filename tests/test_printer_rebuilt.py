"""A state rebuilt in the iteration and passed to a fragment prints as its base with the leaves that differ
overridden by path (`%state.learner {key: %g.0}`), not as a bracketed list of every leaf; the parser reads it
back into the same leaves."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from flax import struct

import fragc
from fragc.ir import ParseError, parse
from fragc.passes import default_passes, resolve, run_pipeline


def _params():
    return {"w1": jnp.ones((3, 4)), "w2": jnp.ones((4, 2)), "b": jnp.zeros((2,))}


@struct.dataclass
class Learner:
    params: dict
    opt: dict  # optimizer-like: {"count", "mu": params, "nu": params}
    key: jax.Array


@struct.dataclass
class State:
    learner: Learner
    aux: dict  # {"key", "scale", "shift"}
    step: jax.Array


class Rebuilt:
    """Rebuilds its state three ways before passing it to a fragment: `state.replace(key=k)`,
    `dataclasses.replace(learner, key=k, opt=fresh)`, `{**aux, "key": k}`."""

    def init(self, key):
        k_learn, k_aux = jax.random.split(key)
        opt = {"count": jnp.int32(0), "mu": _params(), "nu": _params()}
        aux = {"key": k_aux, "scale": jnp.float32(1.0), "shift": jnp.zeros((3,))}
        return State(Learner(_params(), opt, k_learn), aux, jnp.int32(0))

    @fragc.fragment(role="learner", in_axes=(None,), out_axes=(None, None))
    def update(self, learner):
        params = jax.tree.map(lambda p: p - 0.1 * jax.random.uniform(learner.key), learner.params)
        return learner.replace(params=params), {"norm": jnp.sum(params["w1"])}

    @fragc.fragment(role="learner", in_axes=(None,), out_axes=(None,))
    def fresh_opt(self, opt):
        return jax.tree.map(jnp.zeros_like, opt)

    @fragc.fragment(role="learner", in_axes=(None,), out_axes=(None, None))
    def update_again(self, learner):
        opt = jax.tree.map(lambda m: m + jax.random.uniform(learner.key).astype(m.dtype), learner.opt)
        return learner.replace(opt=opt), {"count": opt["count"]}

    @fragc.fragment(role="actor", in_axes=(None,), out_axes=(None, None))
    def tweak(self, aux):
        noise = jax.random.normal(aux["key"], (3,))
        return {**aux, "shift": aux["shift"] + aux["scale"] * noise}, {"shift": jnp.mean(noise)}

    def iteration(self, state):
        k_update, k_again, k_aux = jax.random.split(state.learner.key, 3)
        learner, m_update = self.update(state.learner.replace(key=k_update))
        fresh = self.fresh_opt(learner.opt)
        learner, m_again = self.update_again(dataclasses.replace(learner, key=k_again, opt=fresh))
        aux, m_tweak = self.tweak({**state.aux, "key": k_aux})
        return State(learner, aux, state.step + 1), {**m_update, **m_again, **m_tweak}


@pytest.fixture(scope="module")
def module():
    return fragc.trace(Rebuilt())


def call_lines(text):
    """The lines that pass operands to fragments (`run`, `loop`); `return` and placed glue lines, printed
    elsewhere, run longer than 120 characters in the golden files too."""
    return [line for line in text.splitlines() if " = run @" in line or " = loop @" in line]


def run_line(text, fragment):
    return next(line.strip() for line in text.splitlines() if f"= run @{fragment}(" in line)


def test_a_rebuilt_state_prints_as_its_base_with_overrides(module):
    text = str(module)
    update, again, tweak = (run_line(text, f) for f in ("update", "update_again", "tweak"))
    assert update.endswith("(%state.learner {key: %g.0})")  # state.replace(key=k)
    assert again.endswith("(%learner {opt: %fresh_opt_0, key: %g.1})")  # a whole subtree overridden by one name
    assert tweak.endswith("(%state.aux {key: %g.2})")  # {**aux, "key": k}
    for line in (update, again, tweak):
        assert "[" not in line, line
    assert all(len(line) <= 120 for line in call_lines(text)), max(call_lines(text), key=len)


def test_the_override_form_reads_back_into_the_same_leaves(module):
    text = str(module)
    parsed = parse(text, bodies=module)
    assert str(parsed) == text
    runs = {n.fragment: n.inputs for n in module.graph.nodes if hasattr(n, "fragment")}
    for node in parsed.graph.nodes:
        if hasattr(node, "fragment"):
            assert [(u.value.name, u.index) for u in node.inputs] == \
                [(u.value.name, u.index) for u in runs[node.fragment]], node.fragment


def test_every_module_after_the_passes_round_trips(module):
    for m in run_pipeline(module, default_passes(resolve("actor_learner", 8), 4, "device_put")).modules:
        text = str(m)
        assert str(parse(text, bodies=m)) == text, m.label
        assert all(len(line) <= 120 for line in call_lines(text)), m.label


def test_an_override_of_a_path_the_base_lacks_names_it(module):
    text = str(module).replace("%state.learner {key: %g.0}", "%state.learner {nokey: %g.0}")
    with pytest.raises(ParseError, match="no 1 leaves under 'nokey'"):
        parse(text)
