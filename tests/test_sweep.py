"""Populations over hyperparameters (src/fragc/ir/sweep.py): each member is the single run of its configuration and seed,
the values are printed in the IR and refused in one line when they cannot be swept."""

import dataclasses
import functools
import itertools
import json
import re
import warnings

import chex
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fragc
from conftest import as_numbers, assert_trees_close
from fragc.algos import ppo
from fragc.ir.parser import parse
from fragc.runtime.fused import population_devices
from fragc.sinks import stats
from toy_algos import JittedUpdateRegression, Regression, UsersRegression, regression_by_hand

ITERATIONS = 2
LRS, ENTS, SEEDS = (1e-3, 3e-4), (0.0, 0.01), (0, 1)
TINY = dict(num_envs=4, num_steps=8, total_steps=4 * 8 * 8, update_epochs=1, num_minibatches=2, hidden=16)
"""The CLI test's config too (`SWEEP`): its program is `pbt_program`'s, compiled once (the suite's cache)."""


def tiny(**overrides) -> ppo.PPO:
    return ppo.PPO(ppo.Config(**{**TINY, **overrides}))


@functools.cache
def single_program(lr: float, ent_coef: float) -> fragc.Program:
    return fragc.compile(tiny(lr=lr, ent_coef=ent_coef), "single", iterations_per_dispatch=2)


@functools.cache
def single_run(lr: float, ent_coef: float, seed: int, iterations: int = ITERATIONS):
    """The reference: `fragc run ppo --lr LR --ent-coef E --seed S`, a program of its own."""
    prog = single_program(lr, ent_coef)
    return prog.run(prog.init(seed), iterations)


TO_ROUNDING = 1e-5
"""An exact member against its single run under the suite's XLA flags: the same operations, fused differently."""


def grid_members():
    return list(itertools.product(LRS, ENTS, SEEDS))  # configuration-major, seeds adjacent


# The same bits need XLA's defaults (a process of their own, tests/conftest.py): -m slow, on 1 device and spread over
# 4; the default suite checks the same members in this process, where the suite's XLA flags fuse a member's
# program differently from its single run (last bits). Members spread over devices: the vectorised 8-device test.
@pytest.mark.parametrize("devices,bits", [
    pytest.param(1, False, id="1-to_rounding"),
    pytest.param(1, True, marks=[pytest.mark.slow, pytest.mark.xla_defaults], id="1-bits"),
    pytest.param(4, True, marks=[pytest.mark.slow, pytest.mark.xla_defaults], id="4-bits"),
])
def test_each_member_of_a_2x2x2_sweep_is_its_single_run_bit_for_bit(devices, bits):
    prog = fragc.compile(tiny(), fragc.population("single", list(SEEDS), lr=list(LRS), ent_coef=list(ENTS), exact=True),
                         devices=devices, iterations_per_dispatch=2)
    state, history = prog.run(prog.init(0), ITERATIONS)
    assert "population loop seeds=[0, 1, 0, 1, 0, 1, 0, 1]" in prog.ir()
    assert state.hyper["lr"].sharding.mesh.devices.size == devices  # members spread over the devices given
    chex.assert_trees_all_equal(state.hyper, {"lr": np.repeat(np.float32(LRS), 4),
                                              "ent_coef": np.tile(np.repeat(np.float32(ENTS), 2), 2)})
    for m, (lr, ent, seed) in enumerate(grid_members()):
        want, want_history = single_run(lr, ent, seed)
        member, member_history = jax.tree.map(lambda x: x[m], state.state), {k: v[m] for k, v in history.items()}
        if bits:
            chex.assert_trees_all_equal(as_numbers(member), as_numbers(want))
            chex.assert_trees_all_equal(member_history, want_history)
        else:
            assert_trees_close(member, want, rtol=TO_ROUNDING, atol=TO_ROUNDING)
            assert_trees_close(member_history, want_history, rtol=TO_ROUNDING, atol=TO_ROUNDING)
            # (ent_coef's effect on the parameters over 2 iterations, 8e-7 at most, is within the tolerance; on the
            # loss it is ent_coef x entropy, far outside it: a member given the other ent_coef fails here)
    # the grid reaches the maths: members that differ only in lr (or only in ent_coef) differ
    params = as_numbers(state.state.learner.params)
    assert not jax.tree.all(jax.tree.map(lambda p: np.array_equal(p[0], p[4]), params))
    assert not jax.tree.all(jax.tree.map(lambda p: np.array_equal(p[0], p[2]), params))


@functools.cache
def vectorised_program() -> fragc.Program:
    """The 2 x 2 x 2 grid's members vectorised (vmap, the default) over 8 devices."""
    return fragc.compile(tiny(), fragc.population("single", list(SEEDS), lr=list(LRS), ent_coef=list(ENTS)),
                         devices=8, iterations_per_dispatch=2)


def test_vectorised_members_on_8_devices_are_their_single_runs_to_float_rounding_and_the_ir_shows_them():
    """vmap (the default) sums over a batched axis in another order than the single run: last bits only."""
    prog = vectorised_program()
    assert ("population seeds=[0, 1, 0, 1, 0, 1, 0, 1] lr=[0.001, 0.001, 0.001, 0.001, 0.0003, 0.0003, 0.0003, "
            "0.0003] ent_coef=[0.0, 0.0, 0.01, 0.01, 0.0, 0.0, 0.01, 0.01]") in prog.ir()
    assert "%hyperparameters: " in prog.ir()  # every fragment takes the member's values as an argument
    back = parse(prog.ir())
    assert back.hyperparameters == prog.module.hyperparameters and not back.member_loop
    state, history = prog.run(prog.init(0), ITERATIONS)
    assert state.hyper["lr"].sharding.mesh.devices.size == 8
    for m, (lr, ent, seed) in enumerate(grid_members()):
        want, want_history = single_run(lr, ent, seed)
        assert_trees_close(jax.tree.map(lambda x: x[m], state.state), want, rtol=1e-4, atol=1e-6)
        # the metrics too: ent_coef moves the parameters within the tolerance over 2 iterations, the loss beyond it
        assert_trees_close({k: v[m] for k, v in history.items()}, want_history, rtol=1e-4, atol=1e-6)


def test_members_spread_over_the_most_devices_they_divide_over():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every device given is used: nothing to say
        assert [population_devices(m, 8) for m in (8, 16, 64)] == [8, 8, 8] and population_devices(8, 4) == 4
    for members, devices, used in [(1, 8, 1), (3, 8, 3), (12, 8, 6), (7, 4, 1), (5, 4, 1)]:
        with pytest.warns(UserWarning) as said:
            assert population_devices(members, devices) == used
        assert [str(w.message) for w in said] == [
            f"a population of {members} members runs on {used} of the {devices} devices given: members are spread "
            f"over devices in equal blocks, and {used} is the most devices {members} divide over"]


def _factorisations(jaxpr) -> list:
    """Every QR-family equation in `jaxpr` and the jaxprs nested in it (scan, cond, pjit bodies)."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("geqrf", "geqp3", "householder_product", "qr"):
            found.append(eqn)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found += _factorisations(sub)
    return found


def test_a_sweeps_init_runs_its_members_in_turn_so_no_factorisation_is_batched():
    """Regression: a vmapped init batched the orthogonal initializer's QR over members, and two batched LAPACK
    kernels at once deadlock XLA's CPU thread pool (a 40-member PPO sweep hung in its first dispatch)."""
    prog = vectorised_program()
    qrs = _factorisations(jax.make_jaxpr(prog._init_fn())(jnp.uint32(0)).jaxpr)
    assert qrs, "PPO's orthogonal init should factorise"
    assert all(v.aval.ndim == 2 for eqn in qrs for v in eqn.invars), [str(e) for e in qrs]
    state = prog.init(0)
    for member, (lr, ent, seed) in enumerate(grid_members()):
        alone = single_program(lr, ent).init(seed)
        chex.assert_trees_all_equal(jax.tree.map(lambda x: x[member], state.state), alone)


@pytest.mark.parametrize("grid, message", [
    ({"lrr": [1e-3]}, r"^sweep: PPO's config has no field 'lrr' \(did you mean 'lr'\?\)$"),
    ({"activation": ["relu"]}, r"population: activation must be a number or a list of numbers"),
    ({"anneal_lr": [0, 1]}, r"^sweep: PPO's 'anneal_lr' is bool, not a number"),
    ({"lr": [-1.0]}, r"^sweep: lr=-1.0: ppo: lr must be"),
    ({"update_epochs": [1.5]}, r"^sweep: PPO's 'update_epochs' is a whole number, got 1.5$"),
    ({"num_envs": [4, 8]}, r"^sweep: PPO uses 'num_envs' as a Python value \(a shape, a loop count or an `if`\), so "
                           r"members cannot share one program"),
    ({"lr": [1e-3], "num_minibatches": [2, 4]}, r"^sweep: PPO uses 'num_minibatches' as a Python value"),
])
def test_what_cannot_be_swept_is_refused_in_one_line(grid, message):
    with pytest.raises(fragc.FragcError, match=message):
        fragc.compile(tiny(), fragc.population("single", 1, **grid))


class CachedOptimizer(ppo.PPO):
    """A user's PPO that builds its optimizer once, in __init__: sweeping lr would change nothing."""

    def __init__(self, config):
        super().__init__(config)
        self._tx = optax.adam(config.lr)

    @property
    def optimizer(self):
        return self._tx


def test_a_field_copied_at_construction_is_refused_naming_it():
    with pytest.raises(fragc.FragcError, match=r"^sweep: CachedOptimizer never reads config.lr while tracing init and its "
                                               r"iteration: it is unused in this configuration, or it was copied when "
                                               r"the algorithm was built"):
        fragc.compile(CachedOptimizer(ppo.Config(**TINY)), fragc.population("single", 1, lr=[1e-3, 3e-4]))


def test_a_population_of_several_device_groups_or_replicas_is_refused_in_one_line():
    with pytest.raises(fragc.FragcError, match=r"^population\(actor_learner,\.\.\.\): a population vectorises one "
                                               r"program over its members"):
        fragc.compile(tiny(), fragc.population("actor_learner", 2, lr=[1e-3]), devices=2)
    with pytest.raises(fragc.FragcError, match=r"^population\(anakin,\.\.\.\) on 8 devices: anakin runs each member as "
                                               r"8 replicas.*use population\(single,S\)"):
        fragc.compile(tiny(), fragc.population("anakin", 2, lr=[1e-3]), devices=8)


# ---------------------------------------------------------------- population-based training

PBT_GRID = dict(lr=[1e-3, 3e-4], ent_coef=[0.0, 0.01])


@functools.cache
def pbt_program() -> fragc.Program:
    return fragc.compile(tiny(), fragc.population("single", list(SEEDS), pbt=fragc.PBT(every=2), **PBT_GRID),
                         iterations_per_dispatch=2)


def without_keys(tree):
    return [x for x in jax.tree.leaves(tree) if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)]


def test_pbt_copies_the_worst_quarter_from_the_best_and_perturbs_their_values():
    prog = pbt_program()
    assert "pbt every=2 metric=episode_return fraction=0.25 resample=0.25 seed=0" in prog.ir()
    before, _ = prog.run(prog.init(0), 1)  # iteration 1: no step yet
    assert list(before.lineage) == list(range(8))
    after, history = prog.run(before, 1, start=1)  # iteration 2: the step, after the dispatch
    scores = history["episode_return"][:, 0].reshape(8, -1).mean(1)
    lineage = np.asarray(after.lineage)
    copied = [m for m in range(8) if lineage[m] != m]
    assert sorted(copied) == sorted(np.argsort(scores, kind="stable")[:2].tolist())  # the worst 2 of 8
    for m in copied:
        src = lineage[m]
        assert src in np.argsort(scores, kind="stable")[-2:]  # from the best 2
        # right after the copy: every leaf but the PRNG keys and the perturbed values is the source's
        mine, theirs = jax.tree.map(lambda x: x[m], after.state), jax.tree.map(lambda x: x[src], after.state)
        chex.assert_trees_all_equal(without_keys(mine), without_keys(theirs))
        for field, grid in PBT_GRID.items():
            value, source = float(after.hyper[field][m]), float(after.hyper[field][src])
            allowed = [np.float32(source * 0.8), np.float32(source * 1.2)] + [np.float32(v) for v in grid]
            assert any(np.isclose(value, a, rtol=1e-6) for a in allowed), (field, value, source)
    for m in set(range(8)) - set(copied):  # the others keep their values
        assert all(float(after.hyper[f][m]) == float(before.hyper[f][m]) for f in PBT_GRID)


def test_pbt_is_deterministic_and_resumes_exactly():
    prog = pbt_program()
    once, _ = prog.run(prog.init(0), 6)
    again, _ = prog.run(prog.init(0), 6)
    half, _ = prog.run(prog.init(0), 3)
    resumed, _ = prog.run(half, 3, start=3)
    assert len(set(np.asarray(once.lineage).tolist())) < 8  # some member was copied
    for other in (again, resumed):
        chex.assert_trees_all_equal(as_numbers(once), as_numbers(other))


def test_pbt_without_a_grid_or_metric_is_refused_in_one_line():
    with pytest.raises(fragc.FragcError, match=r"^population-based training perturbs hyperparameters: give the "
                                               r"population a grid"):
        fragc.compile(tiny(), fragc.population("single", 4, pbt=fragc.PBT(every=2)))
    with pytest.raises(fragc.FragcError, match=r"^pbt: the algorithm reports no metric 'score' to rank members by; "
                                               r"it reports .*episode_return"):
        fragc.compile(tiny(), fragc.population("single", 2, lr=[1e-3, 3e-4], pbt=fragc.PBT(every=2, metric="score")))
    with pytest.raises(fragc.FragcError, match=r"^pbt: fraction must be in \(0, 0.5\], got 0.9$"):
        fragc.PBT(every=2, fraction=0.9)


# ---------------------------------------------------------------- fragc sweep


SWEEP = ["sweep", "ppo", "--lr", "1e-3,3e-4", "--ent-coef", "0,0.01", "--seeds", "0-1", "--num-envs", "4",
         "--num-steps", "8", "--hidden", "16", "--update-epochs", "1", "--num-minibatches", "2", "--total-steps", "256",
         "--iterations-per-dispatch", "2", "--pbt-every", "2", "--checkpoint-every", "2", "--threshold", "10",
         "--json"]


pytestmark = pytest.mark.usefixtures("commands_compile_each_configuration_once")  # SWEEP compiled once by main()


def sweep(capsys, tmp_path, *extra):
    from fragc.cli import main

    assert main([*SWEEP, "--out", str(tmp_path), *extra]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1]) if "--stop-after" not in extra else None


@pytest.mark.parametrize("extra,message", [
    (["--num-envs", "4,8"], r"num_envs"),
    (["--policy", "auto"], r"--policy auto searches one program's placement, not a sweep's"),
    (["--policy", "actor_learner"], r"actor_learner"),
    (["--pbt-metric", "nosuch"], r"pbt: the algorithm reports no metric 'nosuch' to rank members by"),
])
def test_a_refused_sweep_writes_nothing(capsys, tmp_path, extra, message):
    """Each refusal is one line, and comes before the output folder is made (they left an empty
    `checkpoints` folder; the unknown PBT metric was refused only after the XLA compile)."""
    from fragc.cli import main

    out = tmp_path / "sw"
    assert main([*SWEEP, "--out", str(out), *extra]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    progress = [line for line in err if line.startswith("fragc sweep ppo: compiling")]  # said before tracing
    assert len(err) == len(progress) + 1 and re.search(message, err[-1]), err  # then the refusal, in one line
    assert not out.exists()


@pytest.mark.parametrize("argv,message", [
    (["--out", "/proc/nope/sw"], r"cannot write the sweep's output in '/proc/nope/sw': '/proc' is not writable"),
    (["--seeds", "0-4294967296"], r"seeds must be in 0 \.\. 2\*\*32 - 1"),
    (["--metrics", "/nonexistent/dir/m.jsonl"],
     r"cannot write metrics to '/nonexistent/dir/m\.jsonl': its folder is missing or not writable"),
])
def test_bad_sweep_input_is_one_line(capsys, argv, message):
    """An output folder that cannot be made (it was an `os.makedirs` traceback), a seed range past 2**32 (it built
    the whole list first: a MemoryError)."""
    from fragc.cli import main

    code = None
    try:
        code = main([*SWEEP, *argv])
    except SystemExit as stop:  # argparse's own refusal (the seeds option)
        code = stop.code
    err = capsys.readouterr().err.strip()
    assert code and re.search(message, err), err
    assert "Traceback" not in err


def test_the_search_refuses_a_population_of_no_seeds_in_one_line():
    """`population(auto,0)` ran as `auto`; explicit seeds were "needs a seed count S >= 1"."""
    from fragc.options import search_seeds

    with pytest.raises(fragc.FragcError, match=r"population\('auto', S\) needs a seed count S >= 1, got 0"):
        search_seeds("population(auto,0)")
    with pytest.raises(fragc.FragcError, match=r"searches the placement of S seeds, a count; it got the seeds \[0, 1\]"):
        search_seeds(fragc.population("auto", [0, 1]))
    assert search_seeds("population(auto, 4)") == 4 and search_seeds("auto") == 0 and search_seeds("single") is None


def test_sweep_reports_every_configuration_and_resumes_to_the_same_numbers(capsys, tmp_path,
                                                                         commands_compile_each_configuration_once):
    prog = pbt_program()  # the same sweep in Python (below: the same final returns)
    compiled = len(commands_compile_each_configuration_once)
    whole = sweep(capsys, tmp_path / "whole")
    assert len(commands_compile_each_configuration_once) == compiled  # SWEEP is pbt_program's configuration
    labels = ["lr=0.001 ent_coef=0", "lr=0.001 ent_coef=0.01", "lr=0.0003 ent_coef=0", "lr=0.0003 ent_coef=0.01"]
    assert [c["label"] for c in whole["configurations"]] == labels
    assert whole["best"] in labels and whole["iterations"] == 8
    lines = [json.loads(x) for x in (tmp_path / "whole" / "members.jsonl").read_text().splitlines()]
    assert [(r["iteration"], r["member"]) for r in lines] == [(it, m) for it in range(1, 9) for m in range(8)]
    assert {(r["member"], r["seed"], r["config"]["lr"], r["config"]["ent_coef"])
            for r in lines} == {(m, s, lr, e) for m, (lr, e, s) in enumerate(grid_members())}
    assert any(r["lineage"] != r["member"] for r in lines)  # PBT's lineage is in the members' lines
    finals = {r["member"]: r["episode_return"] for r in lines if r["iteration"] == 8}  # a window of 1 of 8
    for c, row in enumerate(whole["configurations"]):  # the table's numbers are the members' last lines
        assert row["final"] == [finals[2 * c], finals[2 * c + 1]]
    state, history = prog.run(prog.init(0), 8)
    for r in lines:  # each line is its member's iteration in the same sweep run in Python
        np.testing.assert_allclose(r["episode_return"], history["episode_return"][r["member"], r["iteration"] - 1],
                                   rtol=1e-6)
    at_end = [r for r in lines if r["iteration"] == 8]  # PBT's values and lineage as the last dispatch ended
    assert [r["lineage"] for r in at_end] == np.asarray(state.lineage).tolist()
    assert [r["values"] for r in at_end] == [{f: float(state.hyper[f][m]) for f in PBT_GRID} for m in range(8)]
    for r, prev in zip(lines[8:], lines):  # a dispatch's 2 iterations carry the values it ended with
        if r["iteration"] % 2 == 0:
            assert (r["values"], r["lineage"]) == (prev["values"], prev["lineage"])
    from fragc.sinks.video import restore_policy  # fragc video --member 3 reads a sweep's checkpoints

    _, params, _ = restore_policy(tmp_path / "whole" / "checkpoints", member=3)
    chex.assert_trees_all_equal(params, jax.tree.map(lambda x: x[3], state.state.learner.params))
    assert (tmp_path / "whole" / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sweep(capsys, tmp_path / "parts", "--stop-after", "4")
    assert main_resume(capsys, tmp_path / "parts") == whole
    assert (tmp_path / "parts" / "members.jsonl").read_text() == (tmp_path / "whole" / "members.jsonl").read_text()


SEEDS_ALONE = ["sweep", "ppo", "--lr", "1e-3", "--ent-coef", "0.01", "--seeds", "0-1", "--num-envs", "4",
               "--num-steps", "8", "--hidden", "16", "--update-epochs", "1", "--num-minibatches", "2", "--total-steps",
               "256", "--iterations", str(ITERATIONS), "--iterations-per-dispatch", "2", "--exact", "--json", "--no-plot"]


def test_a_sweep_over_seeds_alone_reports_each_seeds_single_run_and_is_tracked_and_quiet_as_a_run_is(capsys, tmp_path):
    """No config option with several values: a plain population of seeds (no SweepState), each member its
    `fragc run ppo --seed S`, its own lineage. The sweep takes `fragc run`'s output options (one sweep for both, to
    keep the suite short): `--track tensorboard` writes TensorBoard event files beside the `--metrics` file (it was
    "ppo has no option --track"), `--metrics` a line per dispatch, and `--quiet` leaves only the report."""
    from fragc.cli import main

    metrics = tmp_path / "m" / "m.jsonl"
    metrics.parent.mkdir()
    assert main([*SEEDS_ALONE, "--out", str(tmp_path), "--track", "tensorboard", "--metrics", str(metrics),
                 "--quiet"]) == 0
    printed = capsys.readouterr()
    summary = json.loads(printed.out.strip().splitlines()[-1])
    assert printed.err.startswith("final score:") and "fragc sweep" not in printed.err  # no header, no progress
    runs = sorted(p.parent.relative_to(tmp_path / "m" / "tensorboard")
                  for p in (tmp_path / "m" / "tensorboard").glob("**/events.out.tfevents.*"))
    assert [r.parts[1:] for r in runs] == [("config_0", "seed_0"), ("config_0", "seed_1")]  # a run per member
    assert [json.loads(x)["iteration"] for x in metrics.read_text().splitlines()] == [ITERATIONS]
    assert [c["label"] for c in summary["configurations"]] == ["default"]
    lines = [json.loads(x) for x in (tmp_path / "members.jsonl").read_text().splitlines()]
    assert [(r["iteration"], r["member"], r["seed"], r["lineage"], r["values"]) for r in lines] == \
        [(it, m, m, m, {}) for it in range(1, ITERATIONS + 1) for m in range(2)]
    singles = [single_run(1e-3, 0.01, seed)[1]["episode_return"][-1] for seed in SEEDS]  # a window of 1 of 2
    np.testing.assert_allclose(summary["configurations"][0]["final"], singles, rtol=1e-6)


def test_a_sweeps_lines_and_curves_have_a_point_per_iteration_each_its_single_runs(capsys, tmp_path, monkeypatch):
    """3 iterations in dispatches of 2 (a dispatch of 2, then of 1): members.jsonl has a line per member and
    iteration, each metric that iteration's value in the member's `fragc run` (it had a line per dispatch, its mean
    over the dispatch), the report's curve a point per iteration at its environment steps, and the final score the
    last tenth of the iterations (1 of 3). The progress lines' best member is the best at the dispatch's last
    iteration (the population's metrics are [members, iterations])."""
    from fragc.cli import main

    drawn, curves_png = {}, stats.curves_png

    def drawing(curves, steps, path, **kwargs):
        drawn.update(curves=curves, steps=steps, window=kwargs["window"])
        return curves_png(curves, steps, path, **kwargs)

    monkeypatch.setattr(stats, "curves_png", drawing)
    argv = [a for a in SEEDS_ALONE if a != "--no-plot"]
    argv[argv.index("--iterations") + 1] = "3"
    assert main([*argv, "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr()
    summary = json.loads(printed.out.strip().splitlines()[-1])
    singles = [single_run(1e-3, 0.01, seed, 3)[1] for seed in SEEDS]  # each metric: [3 iterations]
    lines = [json.loads(x) for x in (tmp_path / "members.jsonl").read_text().splitlines()]
    assert [(r["iteration"], r["member"], r["env_steps"]) for r in lines] == \
        [(it, m, 32 * it) for it in (1, 2, 3) for m in range(2)]  # 4 environments x 8 steps an iteration
    for r in lines:
        history = singles[r["member"]]
        assert set(history) <= set(r)
        for name, values in history.items():
            np.testing.assert_allclose(r[name], values[r["iteration"] - 1], rtol=TO_ROUNDING, atol=TO_ROUNDING,
                                       err_msg=f"{name} of member {r['member']} at iteration {r['iteration']}")
    returns = np.stack([h["episode_return"] for h in singles])  # [seeds, iterations]
    np.testing.assert_allclose(drawn["curves"]["default"], returns, rtol=1e-6)
    np.testing.assert_array_equal(drawn["steps"], [32, 64, 96])
    assert drawn["window"] == (64, 96)  # the final score's window: iteration 3, from the end of iteration 2
    assert summary["final_window"] == {"reports": 1, "of": 3, "iterations": [3, 3]}
    np.testing.assert_allclose(summary["configurations"][0]["final"], returns[:, -1], rtol=1e-6)
    best = [float(x) for x in re.findall(r"best member (-?[0-9.]+)", printed.err)]
    np.testing.assert_allclose(best, returns[:, [1, 2]].max(0), atol=0.051)  # after iterations 2 and 3


def test_track_dir_without_track_is_refused_before_the_sweep_writes(capsys, tmp_path):
    from fragc.cli import main

    assert main([*SEEDS_ALONE, "--out", str(tmp_path / "out"), "--track-dir", str(tmp_path / "tb")]) == 2
    assert "give --track SINKS too" in capsys.readouterr().err and not (tmp_path / "out").exists()


def main_resume(capsys, out):
    from fragc.cli import main

    assert main([*SWEEP, "--out", str(out), "--resume"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.slow
def test_sweep_resumed_after_sigkill_ends_on_the_numbers_of_an_uninterrupted_one(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    longer = [*SWEEP[:SWEEP.index("--total-steps") + 1], "16384", *SWEEP[SWEEP.index("--total-steps") + 2:], "--no-plot"]
    command = [sys.executable, "-m", "fragc.cli", *longer]
    whole = subprocess.run([*command, "--out", str(tmp_path / "whole")], capture_output=True, text=True, check=True)
    killed = subprocess.Popen([*command, "--out", str(tmp_path / "killed")], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    checkpoints = tmp_path / "killed" / "checkpoints"
    while killed.poll() is None and not (checkpoints.is_dir() and len([p for p in os.listdir(checkpoints)
                                                                       if p.isdigit()]) >= 3):
        time.sleep(0.05)
    os.kill(killed.pid, signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL  # killed mid-run, not finished
    assert (tmp_path / "killed" / "summary.json").exists() is False
    resumed = subprocess.run([*command, "--out", str(tmp_path / "killed"), "--resume"], capture_output=True,
                             text=True, check=True)
    assert json.loads(resumed.stdout.splitlines()[-1]) == json.loads(whole.stdout.splitlines()[-1])
    assert (tmp_path / "killed" / "members.jsonl").read_text() == (tmp_path / "whole" / "members.jsonl").read_text()


SWEPT = {"ppo": ("lr", "gamma", "clip_eps"), "a2c": ("lr", "ent_coef"), "ppo_continuous": ("lr", "vf_coef"),
         "dqn": ("lr", "gamma", "eps_end"), "pqn": ("lr", "td_lambda"), "ppo_rnn": ("lr", "gae_lambda"),
         "impala": ("lr", "rho_bar"), "sac": ("q_lr", "tau"), "ippo": ("lr", "clip_eps"),
         "mappo": ("lr", "ent_coef"), "ippo_rnn": ("lr", "clip_eps"), "mappo_rnn": ("lr", "vf_coef"),
         "alphazero": ("lr",), "muzero": ("lr", "td_lambda")}


@pytest.mark.parametrize("name", sorted(SWEPT))
def test_every_built_in_algorithm_sweeps_its_float_hyperparameters(name):
    """Traced and placed (no XLA compile): every swept field reaches the program, none is a Python value."""
    from fragc.algos import ALGOS, make
    from fragc.compiler import run_passes
    from fragc.options import CompileOptions

    assert set(SWEPT) == set(ALGOS)
    algo = make(name)
    grid = {f: [getattr(algo.config, f), getattr(algo.config, f) * 0.5] for f in SWEPT[name]}
    pipeline = run_passes(algo, CompileOptions(fragc.population("single", 1, **grid)))[0]
    assert [f for f, _ in pipeline.final.hyperparameters] == list(SWEPT[name])


# ---------------------------------------------------------------- a user's algorithm


def test_a_users_algorithm_sweeps_its_config_and_each_member_follows_a_plain_jax_loop():
    lrs, seeds, iterations = [0.05, 0.1, 0.2], [0, 1], 3
    prog = fragc.compile(UsersRegression(), fragc.population("single", seeds, lr=lrs), iterations_per_dispatch=2)
    state, history = prog.run(prog.init(0), iterations)
    init, step = jax.jit(UsersRegression().init), jax.jit(regression_by_hand, static_argnums=1)
    for m, (lr, seed) in enumerate(itertools.product(lrs, seeds)):
        ref = init(jax.random.key(seed))
        for _ in range(iterations):
            ref, metrics = step(ref, 1, lr)
        assert_trees_close(jax.tree.map(lambda x: x[m], state.state), ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(history["loss"][m, -1], metrics["loss"], rtol=1e-5)


def test_a_jitted_helper_reading_the_config_follows_each_members_values_after_a_single_run_traced_it():
    """JAX caches the helper's jaxpr with the config's own lr (a constant) when the single run traces it; each trace
    has a tracing-cache scope of its own (src/fragc/ir/frontend.py `_JIT_CACHE_SCOPE`), so each member's update uses its own
    lr."""
    algo, lrs, iterations = JittedUpdateRegression(), [0.05, 0.2], 2
    fragc.compile(algo, "single")
    prog = fragc.compile(algo, fragc.population("single", [0], lr=lrs), iterations_per_dispatch=2)
    state, _ = prog.run(prog.init(0), iterations)
    step = jax.jit(regression_by_hand, static_argnums=1)
    for m, lr in enumerate(lrs):
        ref = jax.jit(algo.init)(jax.random.key(0))
        for _ in range(iterations):
            ref, _ = step(ref, 1, lr)
        assert_trees_close(jax.tree.map(lambda x: x[m], state.state), ref, rtol=1e-5, atol=1e-6)


def test_the_final_metrics_line_of_a_population_is_its_last_iteration_over_members():
    from fragc.cli.run import last_metrics

    history = {"episode_return": np.array([[1.0, 2.0, 3.0], [5.0, 6.0, 9.0]])}  # [members, iterations]
    assert last_metrics(history, population=True) == {"episode_return": 6.0}
    assert last_metrics({"episode_return": np.array([1.0, 4.0])}) == {"episode_return": 4.0}


def test_the_report_scores_the_last_tenth_of_the_iterations_and_names_pbts_starting_configurations(tmp_path, capsys):
    """A members.jsonl written by hand: 2 starting configurations x 3 seeds under PBT, 20 iterations. Each final
    score is the member's mean over its last 2 iterations (a tenth), in the table, summary.json and the plot's
    legend; the table says which iterations and that configurations are where members started; each member's values
    at the end are listed; 3 seeds get the note."""
    from fragc.sweep import Members, report

    members = Members([0, 1, 2], {"lr": [1e-3, 3e-4]}, steps_per_iteration=10, pbt=True)
    lines = [{"iteration": it, "member": m, "seed": members.seed(m), "config": members.config(m),
              "values": {"lr": 0.5 * m + it}, "lineage": 5 - m, "episode_return": 100.0 * m + it}
             for it in range(1, 21) for m in range(6)]
    (tmp_path / "members.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    summary = report(str(tmp_path / "members.jsonl"), members, None, str(tmp_path))
    text = capsys.readouterr().out
    by_hand = [100.0 * m + (19 + 20) / 2 for m in range(6)]  # the mean of iterations 19 and 20
    assert [c["final"] for c in summary["configurations"]] == [by_hand[:3], by_hand[3:]]
    assert summary["final_window"] == {"reports": 2, "of": 20, "iterations": [19, 20]}
    assert "over its last 2 of 20 iterations (19-20, the last tenth)" in text and "starting configuration" in text
    assert "* best starting configuration (highest IQM): lr=0.0003" in text
    assert [(m["member"], m["values"], m["lineage"], m["final"]) for m in summary["members"]] == \
        [(m, {"lr": 0.5 * m + 20}, 5 - m, by_hand[m]) for m in range(6)]
    assert re.search(r"^5 +2 +lr=0.0003 +lr=22.5 +0 +519.5$", text, re.M)  # the member's row at the end
    assert summary["note"] in text and "with 3 seeds the IQM is the mean" in summary["note"]
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_curves_band_is_what_its_legend_says_and_every_report_is_a_point():
    """Over 3 seeds the shaded band is the seeds' min-max at every point (what the 95% CI is then: the report's
    note), and the legend says so rather than 'bootstrap CI'; over 10 seeds it is the bootstrap CI, said so; a mix
    says both. Every report given is a point of its curve (20 here)."""
    rng = np.random.default_rng(0)
    steps = np.arange(1, 21) * 64
    few, many = rng.normal(0, 1, (3, 20)).cumsum(1), rng.normal(0, 1, (10, 20)).cumsum(1)

    def drawn(curves):
        fig = stats.curves_figure(curves, steps)
        ax = fig.axes[0]
        bands = [band.get_paths()[0].vertices for band in ax.collections]
        return ax.get_legend().get_title().get_text(), [line.get_xdata() for line in ax.get_lines()], bands

    title, lines, [band] = drawn({"few": few})
    assert title == "shaded: the seeds' min-max" and "bootstrap" not in title
    assert [len(x) for x in lines] == [20]
    by_step = {}
    for x, y in band:  # the polygon: the low edge out and the high edge back (plus closing vertices)
        by_step.setdefault(x, set()).add(y)
    for j, x in enumerate(steps):
        assert {few[:, j].min(), few[:, j].max()} <= by_step[x]
    title, _, _ = drawn({"many": many})
    assert title == "shaded: 95% bootstrap CI of the IQM"
    assert drawn({"few": few, "many": many})[0] == ("shaded: 95% bootstrap CI of the IQM (4 seeds or fewer: the "
                                                    "seeds' min-max)")
