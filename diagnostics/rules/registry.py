"""Every rule, listed explicitly (no reflection): add a rule here and its examples run."""

from __future__ import annotations

from diagnostics.rules.activations_dominate_peak import ActivationsDominatePeak
from diagnostics.rules.base import Rule
from diagnostics.rules.batch_too_small import BatchTooSmall
from diagnostics.rules.exposed_communication import ExposedCommunication
from diagnostics.rules.host_device_sync import HostDeviceSync
from diagnostics.rules.launch_bound_kernels import LaunchBoundKernels
from diagnostics.rules.low_gpu_utilization import LowGpuUtilization
from diagnostics.rules.memory_fragmentation import MemoryFragmentation
from diagnostics.rules.memory_leak import MemoryLeak
from diagnostics.rules.memory_leak_by_site import MemoryLeakBySite
from diagnostics.rules.memory_near_capacity import MemoryNearCapacity
from diagnostics.rules.misshapen_matmul import MisshapenMatmul
from diagnostics.rules.missing_pin_memory import MissingPinMemory
from diagnostics.rules.optimizer_state_dominates import OptimizerStateDominates
from diagnostics.rules.out_of_memory_cause import OutOfMemoryCause
from diagnostics.rules.per_sample_lookups import PerSampleLookups
from diagnostics.rules.rank_stragglers import RankStragglers
from diagnostics.rules.slow_matmul_shape import SlowMatmulShape
from diagnostics.rules.step_time_outliers import StepTimeOutliers
from diagnostics.rules.tensor_cores_unused import TensorCoresUnused
from diagnostics.rules.too_few_workers import TooFewWorkers
from diagnostics.rules.unstable_gradients import UnstableGradients
from diagnostics.rules.unused_embedding_rows import UnusedEmbeddingRows
from diagnostics.rules.worker_restarts import WorkerRestarts

# The five the app, the reports and users' CI gates rely on (ids fixed).
CORE_RULE_IDS: tuple[str, ...] = (
    "low-gpu-utilization",
    "missing-pin-memory",
    "too-few-workers",
    "unstable-gradients",
    "memory-leak",
)

RULES: tuple[Rule, ...] = (
    LowGpuUtilization(),
    MissingPinMemory(),
    TooFewWorkers(),
    UnstableGradients(),
    MemoryLeak(),
    WorkerRestarts(),
    PerSampleLookups(),
    HostDeviceSync(),
    LaunchBoundKernels(),
    TensorCoresUnused(),
    MisshapenMatmul(),
    SlowMatmulShape(),
    MemoryNearCapacity(),
    StepTimeOutliers(),
    BatchTooSmall(),
    UnusedEmbeddingRows(),
    RankStragglers(),
    ExposedCommunication(),
    # from a CUDA memory snapshot (diagnostics.snapshot; docs/MEMORY.md)
    OutOfMemoryCause(),
    MemoryLeakBySite(),
    MemoryFragmentation(),
    ActivationsDominatePeak(),
    OptimizerStateDominates(),
)


def rule_by_id(rule_id: str) -> Rule:
    for rule in RULES:
        if rule.id == rule_id:
            return rule
    raise KeyError(f"unknown rule {rule_id!r}; known: {', '.join(r.id for r in RULES)}")
