"""The verifier's rule tables: each rule rejects a hand-broken module, naming the node and the rule.

Modules come from the passes only (no XLA): the traced Regression, Regression
under actor_learner on 2 devices (transfers, stages, a schedule), PPO under
actor_learner_async (a delay), and PPO on Gymnasium CartPole in a host loop of
2 environment groups.
"""

import dataclasses

import jax
import pytest
from jax.extend import core as jex

import fragc
from fragc.algos import ppo
from fragc.ir import Delay, Mesh, Run, Schedule, TreeType, Use, Value, verify
from fragc.ir.graph_builder import glue_debug_info
from fragc.ir.verifier import MODULE_RULES, NODE_RULES, STEP_RULES
from fragc.passes import default_passes, resolve, run_pipeline
import user_shapes
from toy_algos import Regression


@pytest.fixture(scope="module")
def modules():
    traced = fragc.trace(Regression())
    staged = run_pipeline(traced, default_passes(resolve("actor_learner", 2), 4)).final
    small_ppo = ppo.PPO(ppo.Config(num_envs=8, num_steps=4, num_minibatches=2, update_epochs=1))
    delayed = run_pipeline(fragc.trace(small_ppo), default_passes(resolve("actor_learner_async", 2), 4)).final
    host_ppo = ppo.PPO(ppo.Config(env="gymnasium:CartPole-v1", num_envs=8, num_steps=4))
    two_groups = dataclasses.replace(resolve("single", 1), env_groups=2)
    hosted = run_pipeline(fragc.trace(host_ppo), default_passes(two_groups, 4)).final
    scan = fragc.trace(user_shapes.Scan())
    cond = run_pipeline(fragc.trace(user_shapes.CondSync()), default_passes(resolve("single", 1), 4)).modules[1]
    loop = fragc.trace(user_shapes.WhileLoss())
    return {"traced": traced, "staged": staged, "delayed": delayed, "hosted": hosted, "scan": scan, "cond": cond,
            "while": loop}


def with_nodes(module, nodes):
    return module.replace(graph=module.graph.replace(nodes=tuple(nodes)))


def replace_node(module, index, **changes):
    nodes = list(module.graph.nodes)
    nodes[index] = nodes[index].replace(**changes)
    return with_nodes(module, nodes)


def index_of(module, kind, nth=0):
    return [i for i, n in enumerate(module.graph.nodes) if n.kind == kind][nth]


def replace_fragment(module, name, **changes):
    return module.replace(fragments={**module.fragments, name: module.fragments[name].replace(**changes)})


def replace_placement(module, name, **changes):
    placement = dataclasses.replace(module.fragments[name].placement, **changes)
    return replace_fragment(module, name, placement=placement)


# ---------------------------------------------------------------- one hand-broken module per rule


def swap_first_nodes(m):
    nodes = list(m.graph.nodes)
    return with_nodes(m, [nodes[1], nodes[0], *nodes[2:]])


def define_a_value_twice(m):
    nodes = list(m.graph.nodes)
    return replace_node(m, 1, outputs=(nodes[0].outputs[0], nodes[1].outputs[1]))


def call_an_unknown_fragment(m):
    return replace_node(m, 0, fragment="nope")


def pass_w_where_y_belongs(m):
    """@learn(w, x, y): the state's first leaf (w, f32[3]) where y (f32[8@env]) belongs."""
    learn = m.graph.nodes[1]
    return replace_node(m, 1, inputs=(learn.inputs[0], learn.inputs[1], Use(m.graph.inputs[0], 0)))


def declare_no_batch_axis(m):
    """@learn's x declared without its batch axis: shapes agree, axes do not."""
    fdef = m.fragments["learn"]
    x = fdef.in_types[1]
    in_types = (fdef.in_types[0], x.with_leaves(tuple(t.replace(axis=None) for t in x.leaves)), fdef.in_types[2])
    return replace_fragment(m, "learn", in_types=in_types)


def drop_a_result(m):
    return replace_node(m, 1, outputs=m.graph.nodes[1].outputs[:1])


def forget_the_actors_mesh(m):
    return m.replace(meshes=tuple(mesh for mesh in m.meshes if mesh.name != "actors"))


def two_replicas_on_one_device(m):
    return replace_placement(m, "sample", replicas=2)


def three_replicas_for_eight_envs(m):
    meshes = tuple(Mesh("actors", (0, 2, 3)) if mesh.name == "actors" else mesh for mesh in m.meshes)
    return replace_placement(m.replace(meshes=meshes), "sample", replicas=3)


def read_a_leaf_of_another_group(m):
    i = index_of(m, "run", 1)  # @learn reads the trajectory moved to the learner: read it unmoved instead
    learn, transfer = m.graph.nodes[i], m.graph.nodes[index_of(m, "transfer")]
    inputs = tuple(transfer.inputs[0] if u.value is transfer.outputs[0] else u for u in learn.inputs)
    return replace_node(m, i, inputs=inputs)


def glue_writes_a_leaf_on_another_group(m):
    i = index_of(m, "glue")  # @learner's glue increments the step: say its result lives on @actors
    out = m.graph.nodes[i].outputs[0]
    moved = out.replace(type=out.type.with_leaves(tuple(t.replace(group="actors") for t in out.type.leaves)))
    return replace_node(m, i, outputs=(moved,))


def glue_without_operands(m):
    return replace_node(m, index_of(m, "glue"), inputs=())


def glue_with_a_result_too_many(m):
    i = index_of(m, "glue")
    out = m.graph.nodes[i].outputs[0]
    doubled = fragc.ir.TreeType.of([t.struct() for t in out.type.leaves * 2])
    return replace_node(m, i, outputs=(out.replace(type=doubled),))


def transfer_to_itself(m):
    i = index_of(m, "transfer")
    return replace_node(m, i, dst=m.graph.nodes[i].src)


def transfer_from_the_wrong_group(m):
    i = index_of(m, "transfer")
    node = m.graph.nodes[i]
    return replace_node(m, i, src=node.dst, dst=node.src)


def transfer_to_a_group_its_result_is_not_on(m):
    return replace_node(m.replace(meshes=m.meshes + (Mesh("spare", (5,)),)), index_of(m, "transfer"), dst="spare")


def delay_with_an_initial_value_of_another_type(m):
    i = index_of(m, "delay")
    node = m.graph.nodes[i]
    step = next(Use(m.graph.inputs[0], k) for k, t in enumerate(m.graph.inputs[0].type.leaves) if t.shape == ())
    return replace_node(m, i, initial=(step,) + node.initial[1:])


def return_an_undefined_value(m):
    ghost = Value("ghost", m.graph.inputs[0].type)
    outputs = list(m.graph.outputs)
    outputs[-1] = Use(ghost, 0)
    return m.replace(graph=m.graph.replace(outputs=tuple(outputs)))


def return_swapped_state_leaves(m):
    outputs = list(m.graph.outputs)
    outputs[0], outputs[1] = outputs[1], outputs[0]
    return m.replace(graph=m.graph.replace(outputs=tuple(outputs)))


def with_stages(m, stages):
    """`m` with the iteration's stages replaced in its schedule."""
    return m.replace(schedule=m.schedule.replace(stages=(((), tuple(stages)),)))


def stage_missing_an_input(m):
    stage = m.stages[1]
    return with_stages(m, (m.stages[0], stage.replace(inputs=stage.inputs[1:])))


def stage_holding_a_node_of_another_group(m):
    first, second = m.stages
    return with_stages(m, (first.replace(group="learner"), second))


def fused_schedule_over_two_stages(m):
    return m.replace(schedule=m.schedule.replace(executor="fused"))


def learn_as_a_host_loop(m):
    return replace_placement(m, "learn", env_groups=2)


def workers_for_learn(m):
    return replace_placement(m, "learn", env_workers=2)


def split_learn_over_agents(m):
    return replace_placement(m, "learn", split="agent")


def with_agent_axis(fdef, name, arg, k):
    """A copy of `fdef` named `name` whose argument `arg`'s leaf `k` declares its axis 0 an agent axis."""
    types = list(fdef.in_types)
    leaves = list(types[arg].leaves)
    leaves[k] = leaves[k].replace(agent=0, axis=None)
    types[arg] = types[arg].with_leaves(tuple(leaves))
    return fdef.replace(name=name, in_types=tuple(types))


def agent_axes_of_two_lengths(m):
    learn = m.fragments["learn"]
    first = {}  # length -> (argument, leaf) of a leaf with axis 0 of that length
    for arg, t in enumerate(learn.in_types):
        for k, leaf in enumerate(t.leaves):
            if leaf.shape:
                first.setdefault(leaf.shape[0], (arg, k))
    (a, i), (b, j) = list(first.values())[:2]
    return m.replace(fragments={**m.fragments, "agents_a": with_agent_axis(learn, "agents_a", a, i),
                                "agents_b": with_agent_axis(learn, "agents_b", b, j)})


def two_splits_on_one_group(m):
    learn = m.fragments["learn"]
    arg, k = next((a, k) for a, t in enumerate(learn.in_types) for k, leaf in enumerate(t.leaves) if leaf.shape)
    split = with_agent_axis(learn, "learn_agents", arg, k).replace(placement=dataclasses.replace(learn.placement, split="agent"))
    return m.replace(fragments={**m.fragments, "learn_agents": split})


def three_groups_of_eight_envs(m):
    return replace_placement(m, "rollout", env_groups=3)


def host_loop_in_an_spmd_schedule(m):
    return m.replace(schedule=m.schedule.replace(executor="spmd"))


def with_region(m, **changes):
    """`m` with its loop node's region changed."""
    i = index_of(m, "loop")
    return replace_node(m, i, body=m.graph.nodes[i].body.replace(**changes))


def region_nodes(m):
    return m.graph.nodes[index_of(m, "loop")].body.nodes


def loop_of_three_groups(m):
    return replace_node(m, index_of(m, "loop"), groups=3)


def absorb_reads_the_host(m):
    infer, to_host, env_step, back, absorb = region_nodes(m)
    skipped = absorb.replace(inputs=absorb.inputs[:-len(back.inputs)] + env_step.outputs[0].uses())
    return with_region(m, nodes=(infer, to_host, env_step, skipped))


def host_step_reads_the_device(m):
    infer, to_host, env_step, back, absorb = region_nodes(m)
    return with_region(m, nodes=(infer, to_host, env_step.replace(inputs=infer.outputs[0].uses()), back, absorb))


def learn_in_the_region(m):
    infer, *rest = region_nodes(m)
    return with_region(m, nodes=(infer.replace(fragment="learn"), *rest))


def run_a_part_outside_its_loop(m):
    i = index_of(m, "loop")
    node = m.graph.nodes[i]
    return with_nodes(m, [*m.graph.nodes[:i], Run("rollout.env_step", node.inputs, node.outputs),
                          *m.graph.nodes[i + 1:]])


def absorb_twice(m):
    """Absorb run again on the same operands, its second results yielded: a valid edit of the step."""
    region = m.graph.nodes[index_of(m, "loop")].body
    absorb = region.nodes[-1]
    again = absorb.replace(outputs=tuple(Value(v.name + "_again", v.type) for v in absorb.outputs))
    return with_region(m, nodes=(*region.nodes, again),
                       outputs=tuple(u for v in again.outputs for u in v.uses()))


def yield_the_carry_read(m):
    """The step's carry yielded unchanged: a valid edit of the step."""
    region = m.graph.nodes[index_of(m, "loop")].body
    carry = len(region.inputs[1].type.leaves)
    return with_region(m, outputs=region.inputs[1].uses() + region.outputs[carry:])


def skip_the_host(m):
    """The host step placed on the loop's group: the step runs nothing on the host."""
    return replace_placement(m, "rollout.env_step", group="main")


def transfer_back_to_another_group(m):
    infer, to_host, env_step, back, absorb = region_nodes(m)
    out = back.outputs[0]
    other = out.replace(type=out.type.with_leaves(tuple(t.replace(group="elsewhere") for t in out.type.leaves)))
    moved = back.replace(dst="elsewhere", outputs=(other,))
    return with_region(m, nodes=(infer, to_host, env_step, moved, absorb.replace(
        inputs=absorb.inputs[:-len(back.inputs)] + other.uses())))


def glue_on_the_host(m):
    """A glue step added after the host step, reading its results on the host."""
    infer, to_host, env_step, back, absorb = region_nodes(m)
    leaf = env_step.outputs[0].uses()[0]
    var = jex.Var(jax.core.ShapedArray(leaf.type.shape, leaf.type.dtype))
    body = jex.ClosedJaxpr(jex.Jaxpr([], [var], [var], [], debug_info=glue_debug_info(1, 1)), [])
    value = Value("on_host", TreeType.of((leaf.type.struct(),)).with_leaves((leaf.type,)))
    glue = fragc.ir.Glue(body, (leaf,), (value,))
    return with_region(m, nodes=(infer, to_host, env_step, glue, back, absorb))


def a_loop_in_the_step(m):
    """A `for` region (from another module) inside a host loop's step."""
    loop = next(n for n in m.graph.nodes if n.kind == "loop")
    return with_region(m, nodes=region_nodes(m) + (dataclasses.replace(loop),))


def yield_the_carry_out_of_order(m):
    region = m.graph.nodes[index_of(m, "loop")].body
    carry = len(region.inputs[1].type.leaves)
    return with_region(m, outputs=region.outputs[1:carry] + region.outputs[:1] + region.outputs[carry:])


def region_index(m, kind):
    return index_of(m, kind)


def loop_over_five_trips(m):
    """The body's outputs stacked over 3 trips, but the node says 5."""
    return replace_node(m, region_index(m, "for"), trips=5)


def loop_reading_a_constant_of_another_shape(m):
    i = region_index(m, "for")
    node = m.graph.nodes[i]
    return replace_node(m, i, inputs=(node.inputs[1],) + node.inputs[1:])  # the targets y where data.x goes


def condition_yielding_the_counter(m):
    """The while's condition yields the carry's update counter (an i32) instead of its test."""
    i = region_index(m, "while")
    node = m.graph.nodes[i]
    counter = node.cond.inputs[1].uses()[-1]
    return replace_node(m, i, cond=node.cond.replace(outputs=(counter,)))


def branch_yielding_twice(m):
    i = region_index(m, "if")
    node = m.graph.nodes[i]
    other = node.branches[0]
    return replace_node(m, i, branches=(other.replace(outputs=other.outputs * 2), node.branches[1]))


def delay_in_a_branch(m):
    i = region_index(m, "if")
    node = m.graph.nodes[i]
    then = node.branches[1]
    ops = then.inputs[0]
    leaves = ops.type.leaves[:1]
    value = Value("stale_in_branch", TreeType.of((leaves[0].struct(),)).with_leaves(leaves))
    delay = Delay(inputs=ops.uses()[:1], initial=ops.uses()[:1], outputs=(value,))
    return replace_node(m, i, branches=(node.branches[0], then.replace(nodes=(delay,) + then.nodes)))


CASES = [
    ("for_operands_match_the_body", "scan", loop_reading_a_constant_of_another_shape,
     r"\(for -> %carry1, %ys\): operand 0 is f32\[8@env\], but the body reads f32\[8@env,3\]"),
    ("for_results_are_the_carry_and_the_stacked_outputs", "scan", loop_over_five_trips,
     r"\(for -> %carry1, %ys\): %ys is not the body's outputs stacked over 5 trips"),
    ("while_operands_match_the_graphs", "while", condition_yielding_the_counter,
     r"\(while -> %carry\d*\): the condition yields i32\[\], not one bool\[\] scalar"),
    ("if_branches_take_the_operands_and_yield_the_results", "cond", branch_yielding_twice,
     r"\(if -> %branch\): the else branch does not yield the types of %branch"),
    ("region_holds_no_delay_or_host_loop", "cond", delay_in_a_branch,
     r"\(if -> %branch\): a region holds a delay \(delay -> %stale_in_branch\)"),
    # rule, module, breaker, what the message says
    ("operands_defined_before_use", "traced", swap_first_nodes,
     r"001_trace: node 0 \(run @learn -> %learn_0, %learn_1\): uses %data before it is defined"),
    ("results_defined_once", "traced", define_a_value_twice,
     r"node 1 \(run @learn -> %sample_0, %learn_1\): value %sample_0 is defined twice"),
    ("fragment_is_defined", "traced", call_an_unknown_fragment,
     r"node 0 \(run @nope -> .*\): fragment @nope is not defined"),
    ("operands_match_the_arguments", "traced", pass_w_where_y_belongs,
     r"node 1 \(run @learn -> %learn_0, %learn_1\): operand 2 is f32\[3\], but @learn expects f32\[8@env\]"),
    ("operands_match_the_arguments", "traced", declare_no_batch_axis,
     r"node 1 \(run @learn .*\): operand 1 is f32\[8@env,3\], but @learn expects f32\[8,3\]"),
    ("results_match_the_fragment", "traced", drop_a_result, r"node 1 \(run @learn -> %learn_0\): 1 results, but @learn returns 2"),
    ("placed_on_a_mesh", "staged", forget_the_actors_mesh,
     r"node 0 \(run @sample .*\): @sample runs on @actors, which the module does not define"),
    ("replicas_fill_the_group", "staged", two_replicas_on_one_device,
     r"node 0 \(run @sample .*\): @sample has 2 replicas, but shard_map on @actors \(1 devices\) runs 1"),
    ("batch_axes_divide_by_replicas", "staged", three_replicas_for_eight_envs,
     r"node 0 \(run @sample .*\): batch axis of length 8 does not divide by 3 replicas"),
    ("host_loop_splits_the_environments", "hosted", learn_as_a_host_loop,
     r"\(run @learn .*\): @learn runs as a host loop \(env_groups=2\) but steps no host environments"),
    ("host_loop_splits_the_environments", "hosted", three_groups_of_eight_envs,
     r"\(loop @rollout .*\): batch axis of length 8 does not divide into 3 environment groups on each of 1 replicas"),
    ("loop_runs_a_host_loop", "hosted", loop_of_three_groups,
     r"\(loop @rollout .*\): a loop of 3 groups runs @rollout, which is not placed as a host loop of as many"),
    ("part_of_the_loop", "hosted", absorb_reads_the_host,
     r"step node 3 \(run @rollout.absorb .*\): operand \d+ lives on @host, but @rollout.absorb runs on @main"),
    ("part_of_the_loop", "hosted", host_step_reads_the_device,
     r"step node 2 \(run @rollout.env_step .*\): operand 0 lives on @main, but @rollout.env_step runs on @host"),
    ("part_of_the_loop", "hosted", learn_in_the_region, r"step node 0 \(run @learn .*\): @learn is not a part of @rollout"),
    ("step_takes_what_the_prefix_makes", "hosted", yield_the_carry_out_of_order,
     r"the step does not yield its carry's types"),
    ("step_crosses_to_the_host", "hosted", skip_the_host, r"\(loop @rollout .*\): the step runs nothing on the host"),
    ("step_transfer_crosses_to_the_host", "hosted", transfer_back_to_another_group,
     r"step node 3 \(transfer .*\): moves @host -> @elsewhere via device_put; a step moves @main -> @host"),
    ("step_glue_on_the_loops_group", "hosted", glue_on_the_host,
     r"step node 3 \(glue -> %on_host\): a leaf lives on @host, but glue in a step runs on @main"),
    ("step_holds_runs_glue_and_transfers", "hosted", a_loop_in_the_step,
     r"step node 5 \(loop @rollout .*\): a host loop's step holds runs, glue and transfers, not a loop"),
    ("part_runs_only_in_its_loop", "hosted", run_a_part_outside_its_loop,
     r"\(run @rollout.env_step .*\): @rollout.env_step is a part of @rollout's host loop; it runs only in that "
     r"loop's step"),
    ("agent_split_splits_agent_axes", "staged", split_learn_over_agents,
     r"\(run @learn .*\): @learn is placed split=agent but declares no agent axis"),
    ("agent_axes_agree", "staged", agent_axes_of_two_lengths, r"agent axes differ in length: "),
    ("one_split_per_group", "staged", two_splits_on_one_group,
     r"@learner runs @learn split=env and @learn_agents split=agent; a group splits one kind of axis"),
    ("env_workers_only_for_host_environments", "hosted", workers_for_learn,
     r"\(run @learn .*\): @learn has env_workers=2 but steps no host environments"),
    ("operands_live_on_the_fragments_group", "staged", read_a_leaf_of_another_group,
     r"\(run @learn .*\): operand 1 lives on @actors, but @learn runs on @learner"),
    ("operands_match_the_glue_body", "traced", glue_without_operands, r"\(glue -> %g\): 0 operands for a body of 1 inputs"),
    ("glue_defines_one_value_of_its_body_outputs", "traced", glue_with_a_result_too_many,
     r"\(glue -> %g\): glue must define one value with one leaf per body output"),
    ("glue_reads_and_writes_one_group", "staged", glue_writes_a_leaf_on_another_group,
     r"\(glue -> %g\): result leaf 0 lives on @actors, but operand 0 on @learner"),
    ("transfer_moves_between_two_groups", "staged", transfer_to_itself,
     r"\(transfer -> %x_to_learner\): moves from @actors to itself"),
    ("transfer_source_is_the_operands_group", "staged", transfer_from_the_wrong_group,
     r"\(transfer -> %x_to_learner\): operand 0 lives on @actors, not on the source @learner"),
    ("transfer_destination_is_the_results_group", "staged", transfer_to_a_group_its_result_is_not_on,
     r"\(transfer -> %x_to_learner\): result leaf 0 lives on @learner, not on the destination @spare"),
    ("delay_types_agree", "delayed", delay_with_an_initial_value_of_another_type,
     r"\(delay -> %stale0\): leaf 0: delayed f32\[.*\]@actors, initial i32\[\]@learner, result f32\[.*\]@actors"),
    ("returned_leaves_are_defined", "traced", return_an_undefined_value,
     r"001_trace: uses %ghost before it is defined"),
    ("returned_state_has_the_input_state_type", "traced", return_swapped_state_leaves,
     r"return: the returned state's types differ from the input state's"),
    ("stages_close_over_the_graph", "staged", stage_missing_an_input,
     r"stage @learner: inputs are not the leaves it reads from outside"),
    ("stages_close_over_the_graph", "staged", stage_holding_a_node_of_another_group,
     r"stage @actors on @learner holds node 0 \(run @sample .*\) of another group"),
    ("schedule_fits_the_graph", "hosted", host_loop_in_an_spmd_schedule,
     r"schedule spmd, but a host loop runs only in a staged schedule"),
    ("schedule_fits_the_graph", "staged", fused_schedule_over_two_stages,
     r"schedule fused, but the iteration has 2 stages and 2 transfers and delays"),
]


def test_the_modules_the_passes_make_verify(modules):
    for module in modules.values():
        assert verify(module) is module


@pytest.mark.parametrize("rule,which,breaker,message", CASES, ids=[f"{c[0]}-{c[2].__name__}" for c in CASES])
def test_a_broken_module_is_rejected_by_its_rule(modules, rule, which, breaker, message):
    with pytest.raises(fragc.VerifyError, match=message + r".*\[rule " + rule + r"\]"):
        verify(breaker(modules[which]))


def test_every_rule_has_a_broken_module():
    rules = {r.__name__ for tables in (NODE_RULES, STEP_RULES) for table in tables.values() for r in table}
    rules |= {r.__name__ for r in MODULE_RULES} | {"step_holds_runs_glue_and_transfers"}
    assert rules == {case[0] for case in CASES}


@pytest.mark.parametrize("edit", [absorb_twice, yield_the_carry_read])
def test_a_host_loops_step_may_be_edited_into_any_valid_step(modules, edit):
    """No rule pins the step to the five nodes `lower_host_loops` makes: a step edited by hand verifies if it is
    valid (its runtime runs it: tests/test_host_loop.py)."""
    edited = edit(modules["hosted"])
    assert verify(edited) is edited
