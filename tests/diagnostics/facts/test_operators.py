from diagnostics.facts.kernel_classes import is_half_precision, is_tensor_core
from diagnostics.facts.linking import build_index
from diagnostics.facts.operators import kernel_table, operator_table, top
from tests.diagnostics.facts.operators_cases import nested_trace, tie_break_trace
from tests.diagnostics.facts.trace_fixture import events_of, gpu


def test_runtime_calls_link_to_the_innermost_operator_on_their_thread():
    index = build_index(nested_trace())
    ops = index.ops.select("op_id", "name")
    name_of = dict(ops.iter_rows())
    linked = {
        row["rt_start_us"]: name_of.get(row["op_id"])
        for row in index.gpu.select("rt_start_us", "op_id").iter_rows(named=True)
    }
    assert linked == {
        20.0: "aten::addmm",
        40.0: "aten::addmm",
        95.0: "aten::linear",
        220.0: "aten::relu",
        30.0: "AddmmBackward0",
    }


def test_operators_nest_by_the_sweeps_tie_breaks_thread_by_thread():
    # at one time, ends come before starts (adjacent operators are siblings); of two starting
    # together the longer opens first, whatever the file order; identical ranges nest in
    # file order; each thread has its own nesting, its rows interleaved with another's
    index = build_index(tie_break_trace())
    ops = {row["name"]: row for row in index.ops.iter_rows(named=True)}
    name_of = {row["op_id"]: row["name"] for row in ops.values()}
    assert {name: (row["depth"], name_of.get(row["parent_id"])) for name, row in ops.items()} == {
        "outer": (1, None),
        "same_as_outer": (2, "outer"),
        "next_to_outer": (1, None),
        "long": (1, None),
        "short": (2, "long"),
        "in_short": (3, "short"),
        "other_thread": (1, None),
        "nested_there": (2, "other_thread"),
        "empty": (0, None),
    }


def test_operator_table_device_self_and_total_and_host_self():
    table = {
        r["name"]: r for r in operator_table(build_index(nested_trace())).iter_rows(named=True)
    }
    addmm, linear = table["aten::addmm"], table["aten::linear"]
    assert addmm["device_us"] == 300 + 20  # the two kernels its own calls launched
    assert addmm["device_total_us"] == 300 + 20
    assert linear["device_us"] == 7  # only the kernel launched directly in it
    assert linear["device_total_us"] == 300 + 20 + 7  # children included
    # host self: 100 minus children aten::t (8) and aten::addmm (80) minus its own call (3).
    assert linear["host_self_us"] == 100 - 8 - 80 - 3
    assert addmm["host_self_us"] == 80 - 10 - 10  # minus its two launch calls
    assert table["aten::relu"]["device_us"] == 5
    assert table["AddmmBackward0"]["device_us"] == 100
    assert table["aten::t"]["device_us"] == 0
    assert "ProfilerStep#1" not in table
    assert top(operator_table(build_index(nested_trace())), "device_us", 1)["name"].to_list() == [
        "aten::addmm"
    ]


def test_kernel_table_sums_per_name_and_flags_classes():
    rows = events_of(
        gpu("volta_h884gemm_64x64_ldg8_nn", 0, 10, None),
        gpu("volta_h884gemm_64x64_ldg8_nn", 20, 30, None),
        gpu("ampere_sgemm_128x64_tn", 60, 5, None),
    )
    table = {r["name"]: r for r in kernel_table(build_index(rows)).iter_rows(named=True)}
    h884 = table["volta_h884gemm_64x64_ldg8_nn"]
    assert (h884["calls"], h884["device_us"], h884["mean_us"]) == (2, 10 + 30, (10 + 30) / 2)
    assert (h884["tensor_core"], h884["fp16"]) == (True, True)
    assert (
        table["ampere_sgemm_128x64_tn"]["tensor_core"],
        table["ampere_sgemm_128x64_tn"]["fp16"],
    ) == (
        False,
        False,
    )


def test_tensor_core_names_across_generations():
    tensor_core = [
        "volta_s884gemm_fp16_128x128_ldg8_f2f_nn",  # Volta
        "turing_fp16_s1688gemm_fp16_256x128_ldg8_f2f_nn",  # Turing
        "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn",  # Ampere
        "void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>",
        "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor16x8x16",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1",  # Hopper
        "void cutlass::device_kernel<cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16>",
        "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT",  # cuBLAS on H100
        "void wgmma_kernel<256>",
    ]
    not_tensor_core = [
        "ampere_sgemm_128x64_tn",
        "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>",
        "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1, true>",
    ]
    assert all(is_tensor_core(n) for n in tensor_core)
    assert not any(is_tensor_core(n) for n in not_tensor_core)
    assert is_half_precision("void at::native::elementwise_kernel<c10::BFloat16>")
    assert is_half_precision("void at::native::reduce_kernel<512, 1, ReduceOp<c10::Half>>")
    assert not is_half_precision("ampere_sgemm_128x64_tn")
