"""The host loop (src/fragc/ir/time_loop.py, src/fragc/runtime/host_loop.py): a rollout that steps host environments runs its time
loop from Python, its environments in `env_groups` groups. Every group count computes the synchronous numbers:
the reference interpreter's, and the device path's for a gymnax environment stepped on the host."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fragc
from fragc.algos import ppo
from fragc.algos.envs import VecEnv
from fragc.compiler import run_passes
from fragc.options import CompileOptions
from fragc.ir import parse, verify
from fragc.ir.dot import to_dot
from fragc.ir.errors import VerifyError
from fragc.ir.interpreter import run_iterations
from fragc.ir.module import HostLoop, Placement
from fragc.ir.time_loop import split_time_loop
from fragc.passes.pipeline import PipelineResult
from fragc.runtime.host_loop import split_step
from fragc.runtime.program import Program
from fragc.runtime.stages import _read_no_more
from fragc.runtime.reporting import params_fingerprint
import shared_programs
from conftest import assert_trees_close
from test_host_envs import GymnaxHostPool, ppo_on, runner_numbers  # registers the gymnax_host backend

HOST_CARTPOLE = "gymnax_host:CartPole-v1"


@pytest.fixture(scope="module")
def single_two_groups():
    """PPO (16 environments) on one device, stepping CartPole on the host in 2 groups of 8."""
    return fragc.compile(ppo_on(HOST_CARTPOLE), "single", env_groups=2)


def test_two_groups_equal_the_device_program_and_the_reference_interpreter(single_two_groups):
    prog = single_two_groups
    state, metrics = prog.run(prog.init(0), shared_programs.ITERATIONS)
    # the device path (gymnax on the device, one program): the same numbers; a group's inference sees 8 rows
    # instead of 16, so matrix products may round differently in the last bit
    _, _, dev_state, dev_metrics = shared_programs.ppo_run("single", 1)
    assert_trees_close(metrics, dev_metrics, rtol=1e-5, atol=1e-5)
    assert_trees_close(state.learner, dev_state.learner, rtol=1e-5, atol=1e-5)
    assert_trees_close(runner_numbers(state.runner), runner_numbers(dev_state.runner), rtol=1e-5, atol=1e-5)
    assert sorted(prog.algo.env.pools) == [tuple(range(8)), tuple(range(8, 16))]  # a pool per group of 8
    # the reference interpreter on the final module: its loop node's region, step by step, the host step
    # called directly, every group at once
    assert any(isinstance(n, HostLoop) for n in prog.module.graph.nodes)
    ref_state, ref_history = run_iterations(prog.module, prog.init(0), shared_programs.ITERATIONS)
    assert_trees_close(state.learner, ref_state.learner, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(metrics["episode_return"], [h["episode_return"] for h in ref_history], rtol=1e-5)


@pytest.mark.parametrize("where", ["the host step", "queueing a device program"])
def test_a_failure_inside_the_loop_leaves_every_pool_usable(single_two_groups, monkeypatch, where):
    """A simulator that raises, or a failure (Ctrl-C, say) while the loop queues a group's device program with
    the next group's host step in flight: the error comes out as itself, the step in flight is received, and
    the next run resets the pools (a pool refuses a reset while a step is in flight) and goes on."""
    prog, state = single_two_groups, single_two_groups.init(0)
    loop = prog._executor.host_loop_executor("rollout")
    owner, name = (GymnaxHostPool, "step") if where == "the host step" else (loop, "_dispatch")
    original, calls = getattr(owner, name), []

    def failing(*args):
        calls.append(1)
        if len(calls) == 3:  # queueing: group 1's host step was started just before group 0's program
            raise RuntimeError(f"failed in {where}")
        return original(*args)

    monkeypatch.setattr(owner, name, failing)
    with pytest.raises(RuntimeError, match=f"failed in {where}"):
        prog.run(state, 1)
    monkeypatch.setattr(owner, name, original)
    with pytest.warns(UserWarning, match="does not continue the host environments' last step"):
        prog.run(state, 1)


def test_the_ir_and_the_executables_show_the_host_loop(single_two_groups):
    prog = single_two_groups
    text = prog.ir()
    assert "fragment @rollout role=actor on @main shard_map replicas=1 host_loop(groups=2) " in text
    assert "host loop groups=2 envs_per_group=8 steps=16" in text
    assert prog.module.schedule.executor == "staged"
    rollout_stage = [s for s in prog.module.stages if any(
        prog.module.graph.nodes[i].kind == "loop" and prog.module.graph.nodes[i].fragment == "rollout"
        for i in s.nodes)]
    assert len(rollout_stage) == 1 and len(rollout_stage[0].nodes) == 1  # a stage of its own
    name = rollout_stage[0].name
    assert [e for e in prog.executables if e.startswith(name + ".")] == [
        f"{name}.{part}" for part in ("prefix", "first", "step", "last", "suffix")]
    assert "stablehlo" in prog.hlo(f"{name}.first") or "func.func" in prog.hlo(f"{name}.first")
    # the trajectory (8 per-step outputs, laid out as the fragment's results) is handed on without a copy:
    # the suffix's results alias its donated inputs
    header = prog.hlo(f"{name}.suffix", optimized=True).splitlines()[0]
    assert len(re.findall(r"\{\d+\}: \(\d+, \{\}, may-alias\)", header)) == 8, header


def test_a_one_replica_host_loop_compiles_without_all_reduces(single_two_groups):
    """A one-replica fragment's reductions over `replica` are dropped before its host loop's programs compile, as
    `lower_fragment` drops them (src/fragc/ir/collectives.py): PPO's rollout psums its episode metrics after the time loop,
    in the suffix, which XLA would keep as an all-reduce over one device. (The numbers: the test above.)"""
    prog = single_two_groups
    rollout = prog.module.fragments["rollout"]
    assert any(e.primitive.name == "psum" for e in rollout.body_for(1).jaxpr.eqns)
    names = [e for e in prog.executables if e.endswith((".prefix", ".first", ".step", ".last", ".suffix"))]
    assert len(names) == 5
    for name in names:
        assert "all-reduce" not in prog.hlo(name, optimized=True), name


def test_the_loop_node_holds_what_runs(single_two_groups):
    """The last pass makes the rollout's run a loop node whose region is one step: infer, the host step on @host
    between two transfers (their bytes a call are the host step's), absorb. The host loop runs the parts'
    bodies for 2 groups and the node's prefix and suffix: the jaxprs the IR holds."""
    prog = single_two_groups
    module, text = prog.module, prog.ir()
    node = next(n for n in module.graph.nodes if isinstance(n, HostLoop))
    assert node.fragment == "rollout" and (node.steps, node.groups) == (16, 2)
    assert "= loop @rollout(%state.learner.params.params, %state.runner) steps=16 groups=2 {" in text
    for line in ("run @rollout.infer(%rollout_consts, %rollout_carry)",
                 "%rollout_ops_to_host = transfer %rollout_ops @main -> @host via device_get   // ",
                 "%rollout_env = run @rollout.env_step(%rollout_ops_to_host)",
                 "%rollout_env_to_main = transfer %rollout_env @host -> @main via device_put   // ",
                 "= run @rollout.absorb(%rollout_res, %rollout_env_to_main)", "yield %rollout_next, %rollout_y"):
        assert line in text, line
    assert "fragment @rollout.env_step role=host on @host host replicas=1 " in text
    assert 'shape=box3d, label="loop @rollout' in to_dot(module)  # fragc ir --dot
    step = module.fragments["rollout"].host_steps[0]
    to_host, back = (n for n in node.body.nodes if n.kind == "transfer")
    assert (to_host.nbytes * node.steps, back.nbytes * node.steps) == (step.to_host, step.from_host)
    # the 16 environments: @env in the region's types, 8 a group
    assert {leaf.shape[leaf.axis] for leaf in node.body.inputs[1].type.leaves} == {16}
    # the executor's phases are the step's nodes as the IR holds them: infer | the host's | absorb
    loop = prog._executor.host_loop_executor("rollout")
    assert loop.node is node
    assert [(s.on_host, s.nodes) for s in loop.segments] == [(False, (0,)), (True, (1, 2, 3)), (False, (4,))]
    first = prog._executor.executables[[e.name for e in prog._executor.executables].index("main.first")]
    carry_in = first.lowered.in_avals[0][0][0]  # its first argument: a group's part of the carry, per replica
    assert carry_in.shape[1] == 8 and parts_of(module) == ["infer", "env_step", "absorb"]


def parts_of(module):
    return [name.rpartition(".")[2] for name, f in module.fragments.items() if f.part_of == "rollout"]


def test_the_trajectory_buffers_are_handed_back_when_nothing_reads_them(single_two_groups):
    """Within a run, each call writes the trajectory into the buffers of the call before (new buffers cost page
    faults while the environments wait): the staged executor hands them back once the iteration's graph reads
    them no more. What the iteration returns (state, metrics, delay values) is never handed back."""
    prog = single_two_groups
    loop = prog._executor.host_loop_executor("rollout")
    made, zeros = [], loop._zeros
    loop._zeros = lambda: (made.append(1), zeros())[1]
    try:
        prog.run(prog.init(0), 3)
        assert made == [1]  # the run's first call: new buffers; the next two wrote into the call before's
    finally:
        loop._zeros = zeros
    a, b = jnp.zeros(3), jnp.ones(3)
    assert _read_no_more({4: [a]}, [b], {}) == {4: [a]}
    assert _read_no_more({4: [a]}, [a], {}) == {}  # returned as state or a metric
    assert _read_no_more({4: [a]}, [b], {0: [a]}) == {}  # a delay value


def test_a_second_run_at_once_of_a_program_with_host_environments_is_refused(single_two_groups):
    """Host environments are the program's own, outside JAX: two runs at once would step the same pools, so a
    run started while another runs (another thread's) is refused in one line; one after the other is fine."""
    prog = single_two_groups
    inside, release = threading.Event(), threading.Event()

    class Hold(fragc.actions.Action):
        def on_metrics(self, iteration, metrics, queued):
            inside.set()
            release.wait(60)

    worker = threading.Thread(target=prog.run, args=(prog.init(0), 1, [Hold()]))
    worker.start()
    try:
        assert inside.wait(120)
        with pytest.raises(fragc.FragcError, match="steps host environments, which one run at a time can step"):
            prog.run(prog.init(0), 1)
    finally:
        release.set()
        worker.join(120)
    prog.run(prog.init(0), 1)


def edited(final, round_trip=False):
    """`final`'s text with a glue step added to its host loop: the host's rewards scaled by 2 before absorb reads
    them (`round_trip`: and sent to the host and back once more, a second crossing), parsed back with the glue's
    body."""
    text = str(final)
    back = "%rollout_env_to_main = transfer %rollout_env @host -> @main via device_put"
    line = next(ln for ln in text.splitlines() if back in ln)
    indent = line[:len(line) - len(line.lstrip())]
    added = [f"%scaled: (f32[16@env]@main) = glue(%rollout_env_to_main.1)   // mul"]
    if round_trip:
        added += ["%scaled_to_host = transfer %scaled @main -> @host via device_get",
                  "%scaled_back = transfer %scaled_to_host @host -> @main via device_put"]
    text = text.replace(line, line + "".join(f"\n{indent}{a}" for a in added))
    reward = "%scaled_back" if round_trip else "%scaled"
    results = ", ".join(f"%rollout_env_to_main.{k}" if k != 1 else reward for k in range(6))
    text = text.replace("run @rollout.absorb(%rollout_res, %rollout_env_to_main)",
                        f"run @rollout.absorb(%rollout_res, [{results}])")
    return parse(text, bodies=final, glue={"scaled": lambda r: r * 2.0})


# one group, and two groups crossing to the host twice a step, in the default suite; two groups crossing once (the
# two cells' union) with -m slow: the default suite was at 354-369 s of its 360 on 2 cores
@pytest.mark.parametrize("groups,round_trip", [(1, False), pytest.param(2, False, marks=pytest.mark.slow), (2, True)])
def test_an_edited_step_runs_as_its_text_says(groups, round_trip):
    """The host loop runs the step the IR holds: a step edited by hand (printed, a glue step added, parsed back;
    with `round_trip` crossing to the host twice a step) verifies, compiles, and its program equals the
    reference interpreter on the edited module, and not the unedited program (the rewards it learns from are
    doubled)."""
    algo = ppo_on(HOST_CARTPOLE)
    pipeline, devices, policy = run_passes(algo, CompileOptions("single", 1, iterations_per_dispatch=2,
                                                                env_groups=groups))
    module = verify(edited(pipeline.final, round_trip))
    assert "%scaled" in str(module) and str(parse(str(module), bodies=module)) == str(module)
    prog = Program(algo, PipelineResult(pipeline.modules + [module]), devices, policy)
    loop = prog._executor.host_loop_executor("rollout")
    assert len(loop.host) == 1 + round_trip and ("main.between1" in prog.executables) == round_trip
    state, metrics = prog.run(prog.init(0), 2)
    ref_state, ref_history = run_iterations(module, prog.init(0), 2)
    assert_trees_close(state.learner, ref_state.learner, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(metrics["episode_return"], [h["episode_return"] for h in ref_history], rtol=1e-5)
    # the unedited numbers: the device program's, which the host path's equal to 1e-5 (two groups: test_two_groups_...
    # above; in the program: test_host_envs.py); compiled for those tests, not again for this one
    _, _, _, plain_metrics = shared_programs.ppo_run("single", 1)
    assert not np.allclose(metrics["episode_return"], plain_metrics["episode_return"][:2])


@pytest.mark.parametrize("policy,devices", [("single", 1), ("anakin", 2), ("actor_learner_async", 4)])
def test_every_pass_parses_back_with_its_host_loop(policy, devices):
    """Passes only (no XLA): the module after every pass prints, parses back with its placement (environment
    groups included), and the final module places the rollout as a host loop in a stage of its own."""
    pipeline, _, _ = run_passes(ppo_on("gymnasium:CartPole-v1"), CompileOptions(policy, devices, env_groups=2))
    for module in pipeline.modules:
        back = parse(str(module), bodies=module)
        for name, fdef in module.fragments.items():
            assert _placement(back.fragments[name].placement) == _placement(fdef.placement)
            assert back.fragments[name].host_steps == fdef.host_steps
        assert str(back) == str(module)
    final = pipeline.final
    assert final.fragments["rollout"].placement.env_groups == 2
    assert final.fragments["learn"].placement.env_groups == 0


def _placement(p: Placement | None):
    return p and (p.group, p.replicas, p.lowering, p.env_groups)


def test_the_time_loop_splits_around_the_host_step():
    """The cut: prefix -> scan operands, infer -> host operands, absorb -> carry and per-step outputs, and the
    leaves the groups split (the runner's, axis 0) against those they share (the parameters)."""
    module = fragc.trace(ppo_on("gymnasium:CartPole-v1"))
    fdef = module.fragments["rollout"]
    loop = split_time_loop(fdef, 2, 2)  # 16 environments: 8 per replica, 4 per group
    assert loop.length == 16 and not loop.reverse and loop.name == "gymnasium:CartPole-v1 step"
    ops = loop.infer.out_avals[:loop.num_operands]
    assert [tuple(a.shape) for a in ops][:3] == [(4,), (4,), (4,)]  # pool indices, pool steps, actions of 4 envs
    carry_axes = loop.group_axes[loop.num_consts:loop.num_consts + loop.num_carry]
    assert set(carry_axes) == {0}  # every runner leaf splits along its environment axis
    consts = zip(loop.group_axes[:loop.num_consts], loop.infer.in_avals[:loop.num_consts])
    assert all(axis is None for axis, aval in consts if 64 in aval.shape)  # the network: the same in every group
    assert set(loop.ys_group_axes) == {1}  # per-step outputs: [time, environment, ...]
    # with one group, the axes two groups would split: where the trajectory's environments are (its layout)
    assert set(split_time_loop(fdef, 2, 1).ys_group_axes) == {1}


def test_bad_environment_groups_are_refused_in_one_line():
    algo = ppo_on("gymnasium:CartPole-v1")  # 16 environments
    with pytest.raises(fragc.FragcError,
                       match="env_groups=3: fragment 'rollout' steps 16 environments, which do not split into 3 equal"):
        run_passes(algo, CompileOptions("single", 1, env_groups=3))
    with pytest.raises(fragc.FragcError, match="env_groups must be an int from 0"):
        run_passes(algo, CompileOptions("single", 1, env_groups=-1))


def test_the_verifier_refuses_a_broken_host_loop():
    pipeline, _, _ = run_passes(ppo_on("gymnasium:CartPole-v1"), CompileOptions("single", 1, env_groups=2))
    final = pipeline.final
    learn = final.fragments["learn"]
    broken = final.replace(fragments={**final.fragments, "learn": learn.replace(
        placement=dataclasses.replace(learn.placement, env_groups=2))})
    with pytest.raises(VerifyError, match=r"@learn runs as a host loop .* steps no host environments "
                                          r"\[rule host_loop_splits_the_environments\]"):
        verify(broken)
    rollout = final.fragments["rollout"]
    broken = final.replace(fragments={**final.fragments, "rollout": rollout.replace(
        placement=dataclasses.replace(rollout.placement, env_groups=3))})
    with pytest.raises(VerifyError, match="does not divide into 3 environment groups"):
        verify(broken)
    fused = final.replace(schedule=dataclasses.replace(final.schedule, executor="spmd"))
    with pytest.raises(VerifyError, match="a host loop runs only in a staged schedule"):
        verify(fused)


@pytest.mark.slow  # two more staged compiles (~20 s on 2 cores)
def test_actor_learner_async_with_two_groups_equals_the_device_program():
    """Sebulba on one host: 2 actor devices, each replica's 8 environments in 2 groups, learning on 2 devices."""
    host = fragc.compile(ppo_on(HOST_CARTPOLE), "actor_learner_async", devices=4, env_groups=2)
    state, metrics = host.run(host.init(0), shared_programs.ITERATIONS)
    _, _, dev_state, dev_metrics = shared_programs.ppo_run("actor_learner_async", 4)
    assert_trees_close(metrics, dev_metrics, rtol=1e-5, atol=1e-5)
    assert_trees_close(state.learner, dev_state.learner, rtol=1e-5, atol=1e-5)
    assert_trees_close(runner_numbers(state.runner), runner_numbers(dev_state.runner), rtol=1e-5, atol=1e-5)


# -m slow: two launched processes and a one-process reference, 23 s of the default suite's 2 busy cores; the fast
# suite's multi-process test is test_distributed's (device environments), its host loop test_two_groups_... above
@pytest.mark.slow
@pytest.mark.parametrize("policy", ["anakin", "actor_learner_async"])
def test_each_process_steps_the_environments_of_its_own_devices(policy):
    """Sebulba on two hosts: 2 processes of 2 devices on jax.distributed, each process stepping the Gymnasium
    environments of its own devices in its host loop, 2 groups; the same bits as one process of 4 devices.
    anakin: every device acts and learns, 2 groups of 1 environment per device. actor_learner_async: each
    process's first device acts (2 groups of 2) and its second learns; trajectories and parameters move within
    each process, only the learners' mean gradient crosses processes."""
    argv = ["run", "ppo", "--env", "gymnasium:CartPole-v1", "--policy", policy, "--num-envs", "8",
            "--num-steps", "16", "--total-steps", "512", "--env-groups", "2", "--json", "--quiet"]
    env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
    cli = [sys.executable, "-m", "fragc.cli"]
    proc = subprocess.Popen([*cli, "launch", "-n", "2", "--", *cli, *argv, "--devices", "2"], text=True, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:  # the one-process reference while the two processes run
        config = ppo.Config(env="gymnasium:CartPole-v1", num_envs=8, num_steps=16, total_steps=512)  # as the CLI's
        prog = fragc.compile(ppo.PPO(config), policy, devices=4, env_groups=2)
        state, history = prog.run(prog.init(0), 4)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr[-2000:]
    (two,) = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    assert (two["processes"], two["devices"], two["iterations"], two["policy"]) == (2, 4, 4, policy)
    assert two["params_fingerprint"] == params_fingerprint(state)
    assert two["final_return"] == pytest.approx(float(history["episode_return"][-1]))


class NestedHostStep:
    """A rollout whose host step sits inside a jit inside its time loop: a host loop cannot cut it."""

    def __init__(self):
        self.env = VecEnv("gymnasium:CartPole-v1")

    def init(self, key):
        return self.env.reset(key, 4)

    @fragc.fragment(role="actor", in_axes=(0,), out_axes=(0, None))
    def rollout(self, runner):
        def step(runner, _):
            runner, out = jax.jit(lambda r: self.env.step(r, jnp.zeros(r.obs.shape[0], jnp.int32)))(runner)
            return runner, out.reward

        runner, rewards = jax.lax.scan(step, runner, None, 3)
        return runner, fragc.psum(rewards.sum())

    def iteration(self, runner):
        runner, total = self.rollout(runner)
        return runner, {"reward": total}


def test_a_rollout_the_host_loop_cannot_cut_runs_in_program_or_is_refused():
    """One group: synchronous either way, so the host step stays in the program (no host_loop in the IR);
    two groups: refused in one line that says what a host loop needs."""
    pipeline, _, _ = run_passes(NestedHostStep(), CompileOptions("single", 1, env_groups=1))
    assert pipeline.final.fragments["rollout"].placement.env_groups == 0
    assert "host_loop(" not in str(pipeline.final) and pipeline.final.schedule.executor == "fused"
    with pytest.raises(fragc.FragcError, match="a host loop needs exactly one host step directly in its time loop"):
        run_passes(NestedHostStep(), CompileOptions("single", 1, env_groups=2))


class PerStepOutputs:
    """A rollout whose time loop outputs, each step, each environment's cart position and either a step count
    (the same in every environment group) or the mean reward over the environments (`reduce`: each group's
    own)."""

    def __init__(self, reduce: bool = False, reverse: bool = False):
        self.env, self.reduce, self.reverse = VecEnv(HOST_CARTPOLE), reduce, reverse

    def init(self, key):
        return self.env.reset(key, 8)

    @fragc.fragment(role="actor", in_axes=(0,), out_axes=(0, 1, None))
    def rollout(self, runner):
        def step(carry, _):
            runner, count = carry
            runner, out = self.env.step(runner, (runner.obs[:, 2] > 0).astype(jnp.int32))  # push towards the lean
            # per environment: its cart's position (a value of its own, each step), else the same in every group
            return (runner, count + 1), (runner.obs[:, 0], out.reward.mean() if self.reduce else count)

        (runner, _), (positions, per_step) = jax.lax.scan(step, (runner, jnp.int32(0)), None, 5, reverse=self.reverse)
        return runner, positions, per_step

    def iteration(self, runner):
        runner, positions, per_step = self.rollout(runner)
        return runner, {"positions": positions, "per_step": per_step}


def test_per_step_outputs_with_and_without_an_environment_axis():
    """Two groups write their own environments' rows of the positions and group 0 the step count, one group a
    step output with no environment axis stacked: the numbers of the in-program host step. A per-step mean
    over the environments is refused with two groups (each would compute its own) and runs with one."""
    runs = {}
    for groups in (0, 1, 2):
        prog = fragc.compile(PerStepOutputs(), "single", env_groups=groups)
        runs[groups] = prog.run(prog.init(0), 2)
    assert "host_loop(groups=2)" in prog.ir()
    positions = runs[0][1]["positions"]  # [iteration, step, environment]: every value its own
    assert len(np.unique(positions)) == positions.size
    for groups in (1, 2):
        assert_trees_close(runs[groups], runs[0], rtol=0, atol=0)
    np.testing.assert_array_equal(runs[2][1]["per_step"], [[0, 1, 2, 3, 4]] * 2)
    fdef = fragc.trace(PerStepOutputs(reduce=True)).fragments["rollout"]
    assert split_time_loop(fdef, 1, 1).ys_group_axes == (1, None)  # the mean: no environment axis, stacked
    with pytest.raises(fragc.FragcError, match=r"per-step output 1 of its time loop is computed from the "
                                               r"environments but has no environment axis"):
        split_time_loop(fdef, 1, 2)


class NaNPerStep(PerStepOutputs):
    """A per-step output the same on every replica and NaN (a diverged statistic)."""

    @fragc.fragment(role="actor", in_axes=(0,), out_axes=(0, 1, None))
    def rollout(self, runner):
        def step(carry, _):
            runner, count = carry
            runner, out = self.env.step(runner, (runner.obs[:, 2] > 0).astype(jnp.int32))
            return (runner, count + 1), (runner.obs[:, 0], jnp.float32(jnp.nan) * count)

        (runner, _), (positions, per_step) = jax.lax.scan(step, (runner, jnp.int32(0)), None, 5)
        return runner, positions, per_step


def test_the_reference_reports_a_nan_metric_as_nan_not_as_a_replica_mismatch():
    """Two replicas' host loop in the reference interpreter: a replicated per-step output that is NaN on both is
    NaN, not "differs between replicas"."""
    algo = NaNPerStep()
    final = run_passes(algo, CompileOptions("anakin", 2, env_groups=1))[0].final
    assert any(isinstance(n, HostLoop) for n in final.graph.nodes)
    _, history = run_iterations(final, algo.init(jax.random.key(0)), 1)
    assert np.isnan(history[0]["per_step"]).all() and np.isfinite(history[0]["positions"]).all()


class CentredPositions(PerStepOutputs):
    """Each step's cart positions centred on their mean over the environments: an operation across them whose
    result keeps their axis."""

    @fragc.fragment(role="actor", in_axes=(0,), out_axes=(0, 1, None))
    def rollout(self, runner):
        def step(carry, _):
            runner, count = carry
            runner, out = self.env.step(runner, (runner.obs[:, 2] > 0).astype(jnp.int32))
            x = runner.obs[:, 0]
            return (runner, count + 1), (x - x.mean(), count)

        (runner, _), (positions, per_step) = jax.lax.scan(step, (runner, jnp.int32(0)), None, 5)
        return runner, positions, per_step


def test_an_operation_across_the_environments_that_keeps_their_axis_is_refused_with_two_groups():
    """Centring each step's positions on their mean over the environments keeps the environment axis, but two
    groups would each centre on their own mean: refused in one line naming the operation and the user's line;
    one group runs it as the in-program host step does."""
    fdef = fragc.trace(CentredPositions()).fragments["rollout"]
    with pytest.raises(fragc.FragcError, match=r"per-step output 0 of its time loop is computed by an operation "
                                               r"across the environments \(reduce_sum along their axis, at "
                                               r"tests/test_host_loop.py:\d+\)") as err:
        split_time_loop(fdef, 1, 2)
    assert "\n" not in str(err.value)
    runs = [fragc.compile(CentredPositions(), "single", env_groups=g) for g in (0, 1)]
    (_, a), (_, b) = (p.run(p.init(0), 1) for p in runs)
    assert_trees_close(a, b, rtol=0, atol=0)
    np.testing.assert_allclose(a["positions"].mean(axis=-1), 0, atol=1e-6)


def test_a_reversed_time_loop_on_two_replicas_runs_as_its_loop_node_says():
    """A time loop scanned in reverse, 2 replicas of 4 environments in 2 groups: the staged host loop, the
    reference interpreter running the loop node's region, and the in-program host step give the same bits."""
    ref_prog = fragc.compile(PerStepOutputs(reverse=True), "anakin", devices=2, env_groups=0)
    want_state, want = ref_prog.run(ref_prog.init(0), 2)
    prog = fragc.compile(PerStepOutputs(reverse=True), "anakin", devices=2, env_groups=2)
    node = next(n for n in prog.module.graph.nodes if isinstance(n, HostLoop))
    assert node.reverse and (node.steps, node.groups) == (5, 2) and "steps=5 reverse groups=2 {" in prog.ir()
    got_state, got = prog.run(prog.init(0), 2)
    ref_state, ref_history = run_iterations(prog.module, prog.init(0), 2)
    ref = jax.tree.map(lambda *rows: np.stack(rows), *ref_history)
    for state, metrics in ((got_state, got), (ref_state, ref)):
        assert_trees_close(runner_numbers(state), runner_numbers(want_state), rtol=0, atol=0)
        assert_trees_close(metrics, want, rtol=0, atol=0)
    np.testing.assert_array_equal(got["per_step"], [[4, 3, 2, 1, 0]] * 2)  # step t holds the count at t
    # with another replica count than the region was cut for, the reference runs the whole fragment
    one_state, one_history = run_iterations(prog.module, prog.init(0), 2, replicas=1)
    assert_trees_close(runner_numbers(one_state), runner_numbers(want_state), rtol=1e-6, atol=1e-6)
    assert_trees_close(jax.tree.map(lambda *rows: np.stack(rows), *one_history), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("policy,devices,groups", [("single", 1, 1), ("single", 1, 2), ("anakin", 2, 1),
                                                   ("anakin", 2, 2), ("anakin", 4, 4)])
def test_the_loop_node_holds_the_split_it_was_made_from(policy, devices, groups):
    """The loop node holds `split_time_loop`'s cut of the fragment: its prefix and suffix, its parts' bodies for
    its groups, and the groups' axes as the step's `@env` types (passes only)."""
    final = run_passes(ppo_on("gymnasium:CartPole-v1"), CompileOptions(policy, devices, env_groups=groups))[0].final
    node = next(n for n in final.graph.nodes if isinstance(n, HostLoop))
    want = split_time_loop(final.fragments["rollout"], devices, groups)
    assert (node.steps, node.reverse, node.num_consts, node.num_carry) == (
        want.length, want.reverse, want.num_consts, want.num_carry)
    assert str(node.prefix) == str(want.prefix) and str(node.suffix) == str(want.suffix)
    infer = final.fragments["rollout.infer"]
    assert str(infer.body_for(groups)) == str(want.infer)
    axes = [leaf.axis for leaf in infer.in_leaf_types]
    nc, nk = want.num_consts, want.num_carry
    assert axes[:nc + nk] == list(want.group_axes[:nc + nk])
    steps = [s for s in split_step(final, node.body)]
    assert [s.on_host for s in steps] == [False, True, False]
