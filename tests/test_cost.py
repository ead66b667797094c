"""runtime/cost.py: the collective bytes read from XLA's optimised HLO (GSPMD fragments)."""

from fragc.runtime.cost import hlo_collective_bytes

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
