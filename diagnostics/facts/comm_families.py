"""Communication families: which kernels and host ranges are communication, as data.

Communication is not only NCCL. A vLLM job all-reduces through PyTorch's symmetric memory
(NVLS ``multimem`` kernels) or vLLM's own custom all-reduce, an expert-parallel MoE job
moves tokens with DeepEP's dispatch/combine kernels, and those run over NVSHMEM: none of
their kernels has ``nccl`` in its name, and each is as much communication as an NCCL
all-reduce (it waits for the other ranks and moves their data). One table, read by the
communication facts (``facts.comms``), the GPU busy split (``facts.gpu``, through
``kernel_classes.COMMUNICATION``) and the timeline, so no rule keeps its own name list.

Each family names where its events are (``gpu_kernel``: a ``kernel`` row; ``host_op``: a
``cpu_op`` or ``user_annotation`` range that issues a collective from the host), one
case-insensitive regular expression over the event name, and an example name with where it
was seen. Patterns anchor on a word boundary (``\\b``) so that a namespace that merely ends
in a family's name does not match: DeepSeek's traces hold CUB scan kernels in a namespace
``cdpsk::ep::`` beside the real ``dpsk::ep::`` DeepEP kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import polars as pl


class CommPlace(StrEnum):
    GPU_KERNEL = "gpu_kernel"
    HOST_OP = "host_op"


@dataclass(frozen=True)
class CommFamily:
    id: str
    library: str
    place: CommPlace
    pattern: str  # case-insensitive regex over the event name
    example: str
    example_source: str  # where the example name was seen


COMM_FAMILIES: tuple[CommFamily, ...] = (
    CommFamily(
        "nccl",
        "NCCL / RCCL (RCCL keeps NCCL's kernel names)",
        CommPlace.GPU_KERNEL,
        # ncclKernel_* (NCCL < 2.19), ncclDevKernel_* (2.19+), ncclDevKernel_Generic (RCCL)
        r"^nccl",
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
        "shared trace hta_a100_ddp_resnet_rank0_of_2_nccl.json.gz (A100, NCCL 2.17.1); RCCL: "
        "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>) in "
        "tracelens_mi300x_resnet_ddp_actckpt_rank0_of_8.json.gz (MI300X, RCCL 2.22.3)",
    ),
    CommFamily(
        "symmetric_memory",
        "PyTorch symmetric memory (NVLS multimem, one-/two-shot all-reduce)",
        CommPlace.GPU_KERNEL,
        r"\b(multimem_|one_shot_all_reduce|two_shot_all_reduce)",
        "void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>"
        "(c10::BFloat16*, unsigned long, unsigned int**, unsigned long, unsigned long)",
        "shared trace tracelens_b200_vllm_moe_mxfp4_rank0_of_8.json.gz (B200, vLLM)",
    ),
    CommFamily(
        "vllm_custom_all_reduce",
        "vLLM custom all-reduce (csrc/custom_all_reduce.cuh)",
        CommPlace.GPU_KERNEL,
        r"\bcross_device_reduce_",
        "vllm::cross_device_reduce_1stage / vllm::cross_device_reduce_2stage",
        "kernel names in vllm-project/vllm csrc/custom_all_reduce.cuh (no shared trace has one)",
    ),
    CommFamily(
        "deepep",
        "DeepEP expert-parallel dispatch/combine (all-to-all)",
        CommPlace.GPU_KERNEL,
        # the layout kernel (dpsk::ep::cuda / deep_ep::layout) computes, it does not move data
        r"\b(dpsk::ep|deep_ep)::(intranode|internode|internode_ll)::",
        "void dpsk::ep::internode::dispatch<false, 8, true, 8>(...)",
        "deepseek-ai/profile-data train.json (DeepSeek's published training trace); the open "
        "source library's kernels are deep_ep::intranode::combine<...> and the like",
    ),
    CommFamily(
        "nvshmem",
        "NVSHMEM (on-stream collectives and barriers)",
        CommPlace.GPU_KERNEL,
        r"\bnvshmem",
        "nvshmemi_reduce_kernel<float, RDXN_OPS_SUM>",
        "NVIDIA NVSHMEM source, nvshmemi_reduce_kernel (no shared trace has one)",
    ),
    CommFamily(
        "c10d",
        "torch.distributed (c10d ops, record_param_comms, backend ranges)",
        CommPlace.HOST_OP,
        # c10d::allreduce_, record_param_comms (PyTorch's wrapper around every collective),
        # and the backends' own ranges: nccl:all_reduce, gloo:*, ucc:*, mpi:*
        r"^(c10d::|nccl:|gloo:|ucc:|mpi:|record_param_comms$)",
        "c10d::allreduce_, record_param_comms, nccl:all_reduce",
        "shared trace hta_a100_ddp_resnet_rank0_of_2_nccl.json.gz",
    ),
    CommFamily(
        "symmetric_memory_op",
        "PyTorch symmetric memory ops",
        CommPlace.HOST_OP,
        r"^symm_mem::",
        "symm_mem::multimem_all_reduce_",
        "shared trace tracelens_b200_vllm_moe_mxfp4_rank0_of_8.json.gz",
    ),
    CommFamily(
        "vllm_collective_op",
        "vLLM's collective ops (tensor-parallel all-reduce/all-gather)",
        CommPlace.HOST_OP,
        r"^(vllm::(all_reduce|all_gather|reduce_scatter|cross_device_reduce)|_C_custom_ar::)",
        "vllm::all_reduce",
        "shared trace tracelens_b200_vllm_moe_mxfp4_rank0_of_8.json.gz",
    ),
)

HOST_COMM_CATEGORIES: tuple[str, ...] = ("cpu_op", "user_annotation")


def _name_regex(place: CommPlace) -> str:
    return "(?i)" + "|".join(f"(?:{f.pattern})" for f in COMM_FAMILIES if f.place == place)


# Name tests alone (no category): a kernel's name is communication / a host range's name is
# a collective call.
COMM_KERNEL_NAME: pl.Expr = pl.col("name").str.contains(_name_regex(CommPlace.GPU_KERNEL))
HOST_COLLECTIVE_NAME: pl.Expr = pl.col("name").str.contains(_name_regex(CommPlace.HOST_OP))


def comm_family_expr(name: str = "name", cat: str = "cat") -> pl.Expr:
    """The family id of each event (a ``COMM_FAMILIES`` id) or null: kernels are matched
    against the GPU families, ``cpu_op``/``user_annotation`` ranges against the host ones."""
    n, c = pl.col(name), pl.col(cat)
    expr = pl.lit(None, pl.String)
    # chained in reverse so that the table's first family wins when two patterns match
    for family in reversed(COMM_FAMILIES):
        where = (
            c == "kernel"
            if family.place == CommPlace.GPU_KERNEL
            else c.is_in(list(HOST_COMM_CATEGORIES))
        )
        expr = (
            pl.when(where & n.str.contains("(?i)" + family.pattern))
            .then(pl.lit(family.id))
            .otherwise(expr)
        )
    return expr


def family_of(name: str, cat: str) -> str | None:
    """One event's family id (the same rule as ``comm_family_expr``)."""
    return pl.DataFrame({"name": [name], "cat": [cat]}).select(comm_family_expr()).item()


def family(family_id: str) -> CommFamily:
    for f in COMM_FAMILIES:
        if f.id == family_id:
            return f
    raise KeyError(f"no communication family {family_id!r}")
