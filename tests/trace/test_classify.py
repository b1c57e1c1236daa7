"""Kernel-name classification: categories, libraries, collective types, context and user rules."""

from __future__ import annotations

import pytest

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.trace import Classifier, Rule, classify, collective_from_name, load_rules

CASES = [
    # name, category, library, collective
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "gemm", "cublas", None),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1", "gemm", "cublas", None),
    (
        "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(Params)",
        "gemm",
        "cutlass",
        None,
    ),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn", "gemm", None, None),
    (
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0",
        "attention",
        "cudnn",
        None,
    ),
    (
        "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t>>(Flash_fwd_params)",
        "attention",
        "flash_attn",
        None,
    ),
    ("void cudnn::fusion::fmha_reduce_head<true>(void const*, void*, unsigned int)", "attention", "cudnn", None),
    ("transformer_engine::fused_attn::extract_seed_and_offset(long*, bool, long*)", "attention", "te", None),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "comm", "nccl", "all_gather"),
    (
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "comm",
        "nccl",
        "reduce_scatter",
    ),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "comm", "nccl", "all_reduce"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "comm", "nccl", "send_recv"),
    ("ncclSymkDevKernel_AllGather_LL(ncclSymkDevWorkArgs)", "comm", "nccl", "all_gather"),
    ("ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "comm", "nccl", "broadcast"),
    ("kuserbuffers_pushsend(int*, int*, int4*, int4*, int)", "comm", "userbuffers", "send_recv"),
    (
        "kuserbuffers_pushrecv(int, int, int, int, int*, int*, int, unsigned long, int*, int*)",
        "comm",
        "userbuffers",
        "send_recv",
    ),
    (
        "void userbuffers_fp16_sum_inplace_gpu_rr_rs<2>(int, int, int, int, int, int, int, void**, int)",
        "comm",
        "userbuffers",
        "reduce_scatter",
    ),
    ("void userbuffers_fp16_sum_inplace_gpu_rr_rs_oop<2>(int, int)", "comm", "userbuffers", "reduce_scatter"),
    ("void userbuffers_fp16_sum_inplace_gpu_rw_ag<2>(int, int)", "comm", "userbuffers", "all_gather"),
    ("void reduce_bf16_cuda(void*, void*, int, int)", "comm", "userbuffers", "reduce_scatter"),
    (
        "void c10d::symmetric_memory::(anonymous namespace)::barrier_kernel(unsigned int**, int, int, int)",
        "comm",
        "symm_mem",
        "barrier",
    ),
    (
        "void (anonymous namespace)::one_shot_all_reduce_kernel<c10::BFloat16, 16, 8>(c10::BFloat16**)",
        "comm",
        "symm_mem",
        "all_reduce",
    ),
    (
        "void (anonymous namespace)::multimem_all_gather_kernel<16>(char*, char*, unsigned long)",
        "comm",
        "symm_mem",
        "all_gather",
    ),
    ("Memcpy PtoP (Device -> Device)", "peer_copy", "copy_engine", None),
    ("Memcpy DtoD (Device -> Device)", "memcpy", "copy_engine", None),
    ("Memcpy HtoD (Pinned -> Device)", "memcpy", "copy_engine", None),
    ("Memset (Device)", "memset", "cuda", None),
    (
        "void transformer_engine::normalization::rmsnorm_fwd_tuned_kernel<Kernel_traits<4096u>>(Params)",
        "norm",
        None,
        None,
    ),
    (
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float)",
        "norm",
        None,
        None,
    ),
    (
        "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>>(int)",
        "elementwise",
        "aten",
        None,
    ),
    (
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16>>(ReduceOp)",
        "elementwise",
        "aten",
        None,
    ),
    ("void transformer_engine::cast_transpose_kernel<8, __nv_bfloat16>(...)", "elementwise", "te", None),
    ("triton_poi_fused_add_mul_0", "elementwise", "triton", None),
]


@pytest.mark.parametrize(("name", "category", "library", "collective"), CASES)
def test_classify_known_names(name, category, library, collective):
    c = classify(name)
    assert (c.category, c.library, c.collective) == (category, library, collective), c
    assert c.reason and not c.is_fallback


def test_fallback_is_other_and_counted_as_compute():
    c = classify("some_vendor_kernel_xyz")
    assert c.category == "other" and c.is_fallback and c.is_compute and not c.is_comm


def test_comm_and_compute_groups():
    assert classify("Memcpy PtoP (Device -> Device)").is_comm
    assert not classify("Memcpy DtoD (Device -> Device)").is_comm
    assert not classify("Memcpy DtoD (Device -> Device)").is_compute
    assert classify("nvjet_sm90_tst_x").is_compute


def test_cudnn_fusion_needs_attention_context():
    name = "void cudnn::fusion::compute_dot_do_o_specialized<true, 128>(void const*, void const*)"
    assert classify(name).category == "elementwise"
    assert classify(name, context=["FusedAttnFuncBackward"]).category == "attention"
    assert classify(name, context=["aten::mul"]).category == "elementwise"


def test_collective_from_name():
    assert collective_from_name("ncclDevKernel_AllGather_RING_LL") == "all_gather"
    assert collective_from_name("ncclDevKernel_Reduce_Sum_f32_RING_LL") == "reduce"
    assert collective_from_name("ncclDevKernel_AllToAll") == "all_to_all"
    assert collective_from_name("nothing") is None


def test_user_rules_first(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "- pattern: '^my_allgather'\n  category: comm\n  library: custom\n  reason: in-house all-gather\n"
        "- pattern: nvjet_sm90_tst_128\n  category: other\n"
    )
    clf = Classifier(extra_rules=load_rules(rules))
    c = clf.classify("my_allgather_kernel")
    assert (c.category, c.library, c.collective, c.reason) == ("comm", "custom", "all_gather", "in-house all-gather")
    assert clf.classify("nvjet_sm90_tst_128x256").category == "other"
    assert clf.classify("nvjet_sm90_tst_256x128").category == "gemm"


def test_bad_rules(tmp_path):
    with pytest.raises(ConfigError, match="category"):
        Rule("x", "bogus", None, "r")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- pattern: x\n")
    with pytest.raises(ConfigError, match="pattern' and 'category"):
        load_rules(bad)
    bad.write_text("- {pattern: '(', category: gemm}\n")
    with pytest.raises(ConfigError, match="invalid regular expression"):
        load_rules(bad)
