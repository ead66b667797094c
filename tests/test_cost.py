"""src/fragc/runtime/cost.py: the collective bytes (GSPMD fragments) and the kernel launches read from XLA's optimised HLO."""

import jax
import jax.numpy as jnp
from jax import lax

from fragc.runtime.cost import hlo_collective_bytes, hlo_launches

# Lines as XLA's GPU compiler prints them: collectives combined into one instruction of tuple shape, and
# asynchronous pairs (`-start` queues the collective, `-done` waits for it and has the result's shape).
COMBINED = ("  %all-reduce.1 = (f32[8]{0}, s32[2,3]{1,0}) all-reduce(%a, %b), channel_id=2, "
            "replica_groups={{0,1}}, to_apply=%add")
ASYNC_ALL_REDUCE = ("  %all-reduce-start = (f32[1024]{0}, f32[256]{0}) all-reduce-start(%p0, %p1), channel_id=1, "
                    "replica_groups={{0,1}}, to_apply=%add\n"
                    "  %all-reduce-done = (f32[1024]{0}, f32[256]{0}) all-reduce-done(%all-reduce-start)")
ASYNC_ALL_GATHER = ("  %all-gather-start = (f32[4]{0}, f32[16]{0}) all-gather-start(%x), channel_id=3, "
                    "replica_groups={{0,1,2,3}}, dimensions={0}\n"
                    "  %all-gather-done = f32[16]{0} all-gather-done(%all-gather-start)")
ASYNC_PERMUTE = ("  %collective-permute-start = (bf16[8]{0}, bf16[8]{0}, u32[], u32[]) collective-permute-start(%y), "
                 "source_target_pairs={{0,1},{1,0}}\n"
                 "  %collective-permute-done = bf16[8]{0} collective-permute-done(%collective-permute-start)")
PLAIN = ('  %psum.14 = f32[4]{0} all-reduce(%param.2), channel_id=1, replica_groups={{0,1,2,3}}, '
         'use_global_device_ids=true, to_apply=%region_0.0, metadata={op_name="jit(f)/all-reduce"}')


def test_a_plain_collective_counts_its_result():
    assert hlo_collective_bytes(PLAIN) == 4 * 4


def test_a_combined_collective_counts_every_element_of_its_tuple():
    assert hlo_collective_bytes(COMBINED) == 8 * 4 + 6 * 4


def test_an_asynchronous_collective_counts_once_with_its_results_shape():
    assert hlo_collective_bytes(ASYNC_ALL_REDUCE) == (1024 + 256) * 4
    assert hlo_collective_bytes(ASYNC_ALL_GATHER) == 16 * 4  # the gathered result, as a plain all-gather
    assert hlo_collective_bytes(ASYNC_PERMUTE) == 8 * 2


def test_a_whole_module():
    text = "\n".join(["HloModule jit_f", "ENTRY %main {", COMBINED, ASYNC_ALL_REDUCE, ASYNC_ALL_GATHER, ASYNC_PERMUTE,
                      PLAIN, "}"])
    assert hlo_collective_bytes(text) == 8 * 4 + 6 * 4 + (1024 + 256) * 4 + 16 * 4 + 8 * 2 + 4 * 4


# ---------------------------------------------------------------- kernel launches (hlo_launches)

# Hand-written optimised HLO, as XLA prints it: a fused computation's own instructions are not launches.
FUSED = """
%fused_add (p0: f32[8], p1: f32[8]) -> f32[8] {
  %p0 = f32[8]{0} parameter(0)
  %p1 = f32[8]{0} parameter(1)
  %m = f32[8]{0} multiply(%p0, %p1)
  ROOT %a = f32[8]{0} add(%m, %p1)
}
"""
LOOP_16 = FUSED + """
%body (arg: (s32[], f32[8])) -> (s32[], f32[8]) {
  %arg = (s32[], f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %x = f32[8]{0} get-tuple-element(%arg), index=1
  %f1 = f32[8]{0} fusion(%x, %x), kind=kLoop, calls=%fused_add
  %f2 = f32[8]{0} fusion(%f1, %x), kind=kLoop, calls=%fused_add
  %b = f32[8]{0} bitcast(%f2)
  ROOT %t = (s32[], f32[8]{0}) tuple(%i, %b)
}

%cond (arg.1: (s32[], f32[8])) -> pred[] {
  %arg.1 = (s32[], f32[8]{0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%arg.1), index=0
  %c = s32[] constant(16)
  ROOT %lt = pred[] compare(%i.1, %c), direction=LT
}
"""
KNOWN = ('backend_config={"known_induction_variable":{"tuple_index":"0"},"known_init_step":{"init":"0","step":"1"},'
         '"known_trip_count":{"n":"16"}}')


def entry(*lines):
    return "\n".join(["ENTRY %main (x.0: f32[8]) -> f32[8] {", "  %x.0 = f32[8]{0} parameter(0)",
                      "  %zero = s32[] constant(0)", *lines, "}"])


def test_a_loop_with_a_known_trip_count_counts_its_body_that_many_times():
    text = "HloModule m\n" + LOOP_16 + entry(
        "  %init = (s32[], f32[8]{0}) tuple(%zero, %x.0)",
        f"  %w = (s32[], f32[8]{{0}}) while(%init), condition=%cond, body=%body, {KNOWN}",
        "  %y = f32[8]{0} get-tuple-element(%w), index=1",
        "  ROOT %out = f32[8]{0} fusion(%y, %x.0), kind=kLoop, calls=%fused_add")
    # the body's 2 fusions 16 times (its bitcast, tuple and get-tuple-elements free; the condition is not evaluated
    # on a GPU when the trip count is known) and the entry's fusion
    assert hlo_launches(text) == (2 * 16 + 1, True)


def test_only_control_flow_reaches_computations_and_free_instructions_count_nothing():
    free = entry("  %t = (f32[8]{0}, s32[]) tuple(%x.0, %zero)", "  %g = f32[8]{0} get-tuple-element(%t), index=0",
                 "  ROOT %b = f32[8]{0} bitcast(%g)")
    assert hlo_launches(FUSED + free) == (0, True)  # %fused_add is only defined, never a launch of its own
    ops = entry("  %s = f32[8]{0} sort(%x.0), dimensions={0}, to_apply=%fused_add",
                "  %d = f32[8]{0} dot(%s, %s), lhs_contracting_dims={}, rhs_contracting_dims={}",
                "  %cp = f32[8]{0} copy(%d)", "  %ar-start = f32[8]{0} all-reduce-start(%cp), to_apply=%fused_add",
                "  ROOT %ar-done = f32[8]{0} all-reduce-done(%ar-start)")
    assert hlo_launches(FUSED + ops) == (4, True)  # sort, dot, copy, the all-reduce once (its -start)


def test_nested_loops_multiply():
    outer_body = LOOP_16 + """
%outer_body (arg.2: (s32[], f32[8])) -> (s32[], f32[8]) {
  %arg.2 = (s32[], f32[8]{0}) parameter(0)
  %j = s32[] get-tuple-element(%arg.2), index=0
  %x.2 = f32[8]{0} get-tuple-element(%arg.2), index=1
  %zero.2 = s32[] constant(0)
  %init.2 = (s32[], f32[8]{0}) tuple(%zero.2, %x.2)
  %inner = (s32[], f32[8]{0}) while(%init.2), condition=%cond, body=%body, """ + KNOWN + """
  %y.2 = f32[8]{0} get-tuple-element(%inner), index=1
  %f3 = f32[8]{0} fusion(%y.2, %y.2), kind=kLoop, calls=%fused_add
  ROOT %t.2 = (s32[], f32[8]{0}) tuple(%j, %f3)
}
"""
    text = outer_body + entry(
        "  %init = (s32[], f32[8]{0}) tuple(%zero, %x.0)",
        "  %w = (s32[], f32[8]{0}) while(%init), condition=%cond, body=%outer_body, "
        'backend_config={"known_trip_count":{"n":"3"}}',
        "  ROOT %y = f32[8]{0} get-tuple-element(%w), index=1")
    assert hlo_launches(text) == (3 * (2 * 16 + 1), True)


def test_a_conditional_counts_its_costliest_branch():
    branches = FUSED + """
%cheap (a: f32[8]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  ROOT %f = f32[8]{0} fusion(%a, %a), kind=kLoop, calls=%fused_add
}

%costly (a.1: f32[8]) -> f32[8] {
  %a.1 = f32[8]{0} parameter(0)
  %f.1 = f32[8]{0} fusion(%a.1, %a.1), kind=kLoop, calls=%fused_add
  %s.1 = f32[8]{0} sort(%f.1), dimensions={0}, to_apply=%fused_add
  ROOT %f.2 = f32[8]{0} fusion(%s.1, %a.1), kind=kLoop, calls=%fused_add
}
"""
    indexed = entry("  %k = s32[] parameter(1)",
                    "  ROOT %c = f32[8]{0} conditional(%k, %x.0, %x.0, %x.0), "
                    "branch_computations={%cheap, %costly, %cheap}")
    assert hlo_launches(branches + indexed) == (3, True)
    predicated = entry("  %p = pred[] parameter(1)",
                       "  ROOT %c = f32[8]{0} conditional(%p, %x.0, %x.0), true_computation=%cheap, "
                       "false_computation=%costly")
    assert hlo_launches(branches + predicated) == (3, True)


def test_a_loop_of_unknown_trip_count_is_a_lower_bound_unless_it_is_the_dispatch_loop():
    text = LOOP_16 + entry(
        "  %init = (s32[], f32[8]{0}) tuple(%zero, %x.0)",
        '  %w = (s32[], f32[8]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{}}',
        "  ROOT %y = f32[8]{0} get-tuple-element(%w), index=1")
    assert hlo_launches(text) == (2 + 1, False)  # body and condition once
    # a fused program's dispatch loop of n <= k trips (src/fragc/runtime/fused.py): k trips of its body, as a GPU compiles it
    assert hlo_launches(text, dispatch_trips=5) == (5 * 2, True)


def step(x, w):
    """A step XLA's CPU compiler cannot fuse into one kernel: two matrix products, a sort, a cumulative sum."""
    return jnp.cumsum(jnp.sort(jnp.tanh(x @ w), axis=-1), axis=-1) @ w.T


def test_a_scan_counts_its_body_once_a_trip_as_the_unrolled_program_does():
    x, w = jnp.ones((4, 16)), jnp.ones((16, 16))

    def launches(f):
        count, exact = hlo_launches(jax.jit(f).lower(x, w).compile().as_text())
        assert exact
        return count

    def scanned(n):
        return lambda x, w: lax.scan(lambda c, _: (step(c, w), None), x, length=n)[0]

    def unrolled(x, w):
        for _ in range(8):
            x = step(x, w)
        return x

    one, eight, sixteen = launches(step), launches(scanned(8)), launches(scanned(16))
    assert one >= 4  # the two products, the sort, the cumulative sum: not one fusion
    assert (sixteen - eight) % 8 == 0
    per_trip = (sixteen - eight) // 8  # linear in the trip count: a trip's launches
    assert one <= per_trip <= one + 2  # the step's, and the loop's counter
    assert 0 <= eight - 8 * per_trip <= 4  # the loop's set-up (copies of its carry into place)
    assert 8 * one <= eight <= launches(unrolled) + 8 * 2 + 4  # about 8x the step, as its unrolled program


def test_a_compiled_program_reports_its_launches_per_iteration():
    import fragc
    from fragc.algos import ppo

    total = fragc.compile(ppo.PPO(ppo.Config()), "single").cost()["total"]
    assert total["launches"] > 0 and total["launches_exact"]
