"""The trainer's one typed config: dotted keys, scenario presets, ``--set`` overrides.

Every key of INTERFACES.md is a field here. A scenario is nothing but a preset of ordinary
fields (``SCENARIO_PRESETS``), so anything a scenario does a hand-written config can do too,
and ``--set key=value`` overrides a preset one field at a time.

This module imports no torch: ``trainer.launch`` (and so the app) validates forms with it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin

from diagnostics.dotted import flatten_dotted

Device = Literal["auto", "cpu", "cuda"]
DatasetKind = Literal["map", "sharded"]
StoreLookup = Literal["per-sample", "batched"]
AmpMode = Literal["off", "bf16", "fp16"]
ModelSize = Literal["auto", "cpu", "gpu"]
SnapshotStacks = Literal["python", "all"]
SharingStrategy = Literal["file_descriptor", "file_system"]


class ConfigError(ValueError):
    """A bad config value. ``str()`` is the one-line user message: field, what, allowed."""

    def __init__(self, key: str, problem: str, allowed: str | None = None):
        self.key = key
        self.problem = problem
        self.allowed = allowed
        message = f"{key}: {problem}" + (f"; allowed: {allowed}" if allowed else "")
        super().__init__(message)


def _spec(
    default: Any,
    help: str,
    *,
    min: float | None = None,
    max: float | None = None,
    exclusive_min: bool = False,
) -> Any:
    """A dataclass field carrying its description and numeric bounds for validation."""
    meta = {"help": help, "min": min, "max": max, "exclusive_min": exclusive_min}
    return field(default=default, metadata=meta)


@dataclass
class DataConfig:
    rows: int = _spec(
        3000, "synthetic transactions generated (train + validation)", min=64, max=2_000_000
    )
    dataset: DatasetKind = _spec("map", "map-style dataset or sharded IterableDataset")
    shards: int = _spec(8, "shards of the sharded dataset", min=1, max=1024)
    num_workers: int = _spec(1, "DataLoader worker processes", min=0, max=64)
    pin_memory: bool = _spec(True, "page-locked host batches (CUDA only)")
    non_blocking: bool = _spec(True, "asynchronous host-to-device copies")
    prefetch_factor: int = _spec(2, "batches prefetched per worker", min=1, max=64)
    # file_descriptor (PyTorch's default on Linux) hands each tensor of a batch over through
    # a round trip to a thread of the worker: on a busy host each one waits for that thread
    # to get a core (median wait 17-20 ms against 2 ms by file name, 1 worker at nice -15
    # beside 7 runs and 2 busy loops on 2 cores)
    sharing_strategy: SharingStrategy = _spec(
        "file_system",
        "how workers hand batches' tensors to the training process "
        "(torch.multiprocessing sharing strategy): by shared-memory file name, or by file "
        "descriptor passed through a socket per tensor",
    )
    # on in the healthy baseline: without it every epoch forks its workers again. The trainer
    # ignores it with 0 workers and for the sharded dataset (a run note says so).
    persistent_workers: bool = _spec(
        True, "keep workers alive across epochs (map dataset with workers only)"
    )
    tokenize_on_the_fly: bool = _spec(False, "tokenise each sample in __getitem__")
    sample_latency_ms: float = _spec(
        0.0, "simulated storage latency per sample (ms)", min=0.0, max=10_000.0
    )
    # a recurring stall (a remote-storage hiccup): the test that step-time-outliers still
    # fires on recurring slowdowns injects it into a real run
    stall_every: int = _spec(0, "every Nth batch of an epoch stalls; 0 = never", min=0)
    stall_ms: float = _spec(
        0.0, "how long each stalled batch waits, ms (with stall_every)", min=0.0, max=60_000.0
    )
    # the field guide's LMDB embedding store (trainer/embedding_store.py)
    embedding_store: bool = _spec(
        False, "feed the model a precomputed feature vector per transaction from sharded LMDB"
    )
    embedding_lookup: StoreLookup = _spec(
        "batched",
        "store reads: one get per sample in __getitem__, or one batch_get per batch in "
        "__getitems__ (the sharded dataset: one batch_get per batch of its stream)",
    )
    embedding_shards: int = _spec(4, "LMDB environments the store is sharded into", min=1, max=256)
    embedding_dim: int = _spec(16, "length of each stored feature vector", min=1, max=4096)
    store_latency_ms: float = _spec(
        0.0,
        "simulated round trip of a remote key-value store per read transaction (ms)",
        min=0.0,
        max=10_000.0,
    )
    max_length: int = _spec(32, "tokens per sample (padded/truncated)", min=8, max=512)
    vocab_size: int = _spec(
        3000,
        "WordPiece vocabulary size (at most: the corpus may support fewer)",
        min=64,
        max=50_000,
    )
    # the seed pipeline's pruning: WordPiece keeps its whole alphabet and every intermediate
    # merge, most of which the tokenised data never contains; data.vocab_size cannot shed them
    # on in the healthy baseline; the unpruned-vocab scenario turns it off
    prune_vocab: bool = _spec(
        True,
        "embedding rows only for the token ids the training data uses (+ special tokens); "
        "other ids become [UNK]",
    )


@dataclass
class ModelConfig:
    # a preset of the sizing fields (SIZE_PRESETS), resolved when the run starts; any sizing
    # field set explicitly (--set, a fix's patch, the app's form) still wins over it
    size: ModelSize = _spec(
        "auto",
        "size preset of model, batch, tokens and workers: auto = gpu on CUDA, cpu on CPU",
    )
    hidden_size: int = _spec(192, "BERT hidden size", min=16, max=4096)
    layers: int = _spec(2, "BERT encoder layers", min=1, max=48)
    heads: int = _spec(4, "attention heads (must divide hidden_size)", min=1, max=64)
    intermediate_size: int = _spec(768, "feed-forward size", min=16, max=16_384)
    # Megatron-LM's --make-vocab-size-divisible-by: the rows past the vocabulary are never
    # fed (no id reaches them) and their logits learn to stay low; the masked-LM head's
    # GEMMs then have an N the Tensor Cores tile evenly (the misshapen-matmul rule's fix)
    pad_vocab_to_multiple_of: int = _spec(
        1,
        "embedding and masked-LM decoder rows rounded up to a multiple of this; 1 = none",
        min=1,
        max=1024,
    )


@dataclass
class TrainConfig:
    steps: int = _spec(60, "fine-tuning optimiser steps", min=1)
    batch_size: int = _spec(32, "samples per batch", min=1, max=65_536)
    lr: float = _spec(1e-3, "AdamW learning rate", min=0.0, exclusive_min=True)
    weight_decay: float = _spec(0.01, "AdamW decoupled weight decay", min=0.0)
    grad_clip: float | None = _spec(
        1.0, "max total grad norm; null = no clipping", min=0.0, exclusive_min=True
    )
    amp: AmpMode = _spec("bf16", "autocast dtype on CUDA (CPU runs compute in fp32)")
    tf32: bool = _spec(
        False, "TF32 Tensor Cores for fp32 matmuls and convolutions (CUDA, Ampere and later)"
    )
    grad_scaler: bool = _spec(True, "GradScaler (only meaningful with fp16)")
    pretrain_steps: int = _spec(8, "masked-LM steps before fine-tuning; 0 = none", min=0)
    checkpoint_every: int = _spec(20, "checkpoint every N optimiser steps", min=1)
    max_runtime_s: float | None = _spec(
        None, "stop cleanly after this many seconds; null = no budget", min=0.0, exclusive_min=True
    )
    accumulate_loss_as_tensor: bool = _spec(
        False, "`total_loss += loss` without .item(): keeps every graph alive (a leak)"
    )
    keep_batch_history: bool = _spec(
        False, "a Python list keeping every batch and its encoder output (a leak)"
    )


@dataclass
class ProfilerConfig:
    enabled: bool = _spec(True, "torch.profiler over a short window of fine-tuning")
    wait: int = _spec(1, "profiler schedule: steps skipped", min=0)
    warmup: int = _spec(1, "profiler schedule: warm-up steps", min=0)
    active: int = _spec(3, "profiler schedule: recorded steps", min=1)
    repeat: int = _spec(1, "profiler schedule: cycles; 0 = until the end", min=0)
    record_shapes: bool = _spec(True, "record operator input shapes")
    profile_memory: bool = _spec(True, "record tensor allocations")


@dataclass
class InstrumentsConfig:
    enabled: bool = _spec(True, "profiler and system sampler; false = neither")
    sample_hz: float = _spec(
        10.0, "system sampler rate (Hz)", min=0.0, max=100.0, exclusive_min=True
    )
    memory_lines: bool = _spec(False, "line-level memory (memory_profiler); slows the run")
    # off by default: history costs on every allocation for as long as it is on, and the
    # cost on this trainer is not measured yet (scripts/gpu_check.sh measures it)
    memory_snapshot_steps: int = _spec(
        0,
        "CUDA: steps with allocator history, snapshots into memory/ at their first and last "
        "step; 0 = none",
        min=0,
        max=1000,
    )
    memory_snapshot_start: int = _spec(
        2, "CUDA: the first step with allocator history (1-based, whole run)", min=1
    )
    memory_snapshot_stacks: SnapshotStacks = _spec(
        "python", "CUDA: stacks each allocation keeps: python, or all (C++ too: slow dumps)"
    )


@dataclass
class RuntimeConfig:
    # bounded: torch.set_num_threads(100000) runs after the folder exists and then stalls
    threads: int | None = _spec(
        None, "torch CPU threads; null = chosen for the machine", min=1, max=1024
    )
    read_every_steps: int = _spec(
        10,
        "CUDA: steps between device-to-host reads of loss and grad norm (no per-step sync)",
        min=1,
        max=1000,
    )
    alert_after_s: float | None = _spec(
        None,
        "post once to $PIPELINE_DOCTOR_ALERT_WEBHOOK when the run has gone on this many "
        "seconds; null = no alert",
        min=0.0,
        exclusive_min=True,
    )


SyncMode = Literal["overlap", "after-backward"]


@dataclass
class DistributedConfig:
    """Runs under torchrun only (``--nproc-per-node``); a single process ignores them."""

    sync: SyncMode = _spec(
        "overlap",
        "gradient all-reduce: DDP's buckets during backward, or one blocking all-reduce per "
        "tensor after backward (nothing overlaps)",
    )
    bucket_cap_mb: float = _spec(
        25.0, "DDP gradient bucket size (MB), DDP's default", min=0.0, max=1024.0
    )
    straggler_rank: int | None = _spec(
        None, "the rank whose data path is made slower; null = none", min=0, max=4095
    )
    straggler_delay_ms: float = _spec(
        0.0, "extra data-loading time per batch on straggler_rank (ms)", min=0.0, max=60_000.0
    )


@dataclass
class TrainerConfig:
    scenario: str = "healthy"
    # NumPy seeds are 32-bit: a larger one would fail only after the run folder exists
    seed: int = _spec(0, "seed for data, init, masking and data order", min=0, max=2**32 - 1)
    device: Device = _spec("auto", "auto = CUDA when present, else CPU")
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    instruments: InstrumentsConfig = field(default_factory=InstrumentsConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    def to_dict(self) -> dict[str, Any]:
        """Nested dict of every field (JSON-ready); what the manifest's ``config`` holds."""
        return dataclasses.asdict(self)

    def to_flat(self) -> dict[str, Any]:
        """Dotted key -> value for every field."""
        return {key: get_value(self, key) for key in field_keys()}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> TrainerConfig:
        """Rebuilds a config from ``to_dict()`` output (nested or dotted); validates it.

        The scenario named in ``raw`` is recorded but not re-applied: the stored values are
        already resolved, and a later change to a preset must not change an old run.
        """
        flat = flatten_dotted(raw, descend=_SECTIONS.__contains__)
        config = cls(scenario=str(flat.pop("scenario", "healthy")))
        unknown = [key for key in flat if key not in _FIELD_TYPES]
        if unknown:
            raise ConfigError(unknown[0], "unknown key", "see `python -m trainer run --help`")
        for key, value in flat.items():
            set_value(config, key, value)
        validate(config)
        return config


SCENARIOS: dict[str, str] = {
    "healthy": "a well-configured baseline: persistent workers, pinned memory, clipping, "
    "a vocabulary pruned to the ids the data uses",
    "slow-loader": "no workers, tokenising on the fly and 2 ms simulated storage latency per sample",
    "no-pin-memory": "pageable host batches with non_blocking copies (no effect on CPU)",
    "unstable": "a learning rate far too high, no clipping: grad-norm spikes, then NaN (fp16 without GradScaler on CUDA)",
    "leak": "`total_loss += loss` keeps every graph, plus a list that keeps every batch",
    "small-batch": "batches of 2: too small to keep the device busy",
    "fp32": "no AMP and TF32 off: every matmul in full fp32 on CUDA cores, Tensor Cores idle",
    "per-sample-lookups": "an LMDB embedding store read with one get per sample, 2 ms per "
    "read, no workers",
    "unpruned-vocab": "the tokenizer's whole vocabulary as embedding rows: WordPiece keeps "
    "its alphabet and merges, and most rows are never fed",
}

# Scenarios of a job under torchrun (``--nproc-per-node 2`` or more); kept apart from
# SCENARIOS, whose matrix runs each as one process.
DISTRIBUTED_SCENARIOS: dict[str, str] = {
    "straggler": "rank 1's data loading 300 ms slower a batch: every all-reduce waits for it",
    "exposed-communication": "gradients all-reduced after backward, one tensor at a time, "
    "nothing overlapped",
}
DISTRIBUTED_PRESETS: dict[str, dict[str, Any]] = {
    "straggler": {"distributed.straggler_rank": 1, "distributed.straggler_delay_ms": 300.0},
    "exposed-communication": {"distributed.sync": "after-backward"},
}

# Each scenario differs from the defaults (the healthy baseline) only in these fields.
SCENARIO_PRESETS: dict[str, dict[str, Any]] = {
    "healthy": {},
    "slow-loader": {
        "data.num_workers": 0,
        "data.tokenize_on_the_fly": True,
        "data.sample_latency_ms": 2.0,
    },
    "no-pin-memory": {"data.pin_memory": False, "data.non_blocking": True},
    "unstable": {
        # AdamW's decoupled decay is w <- w * (1 - lr * wd): with lr * wd = 2.3 every weight
        # flips sign and grows 1.3x per step, so gradient norms climb by orders of magnitude
        # and the loss overflows to non-finite after ~45 steps (with no clipping to help).
        # Any lr below 2 / wd (e.g. the default 1e-3) is stable again.
        "train.lr": 1.0,
        "train.weight_decay": 2.3,
        "train.grad_clip": None,
        "train.amp": "fp16",
        "train.grad_scaler": False,
    },
    "leak": {"train.accumulate_loss_as_tensor": True, "train.keep_batch_history": True},
    "small-batch": {"train.batch_size": 2},
    # what a GPU does with fp32 and no opt-in: the same model 5.6x slower per step on an
    # H200 (h200-sized/m768l6b256-fp32 against m768l6b256); on CPU it equals healthy
    "fp32": {"train.amp": "off", "train.tf32": False},
    # 32 reads of 2 ms a batch in the training process; batched, one read per shard (4)
    "per-sample-lookups": {
        "data.embedding_store": True,
        "data.embedding_lookup": "per-sample",
        "data.store_latency_ms": 2.0,
        "data.num_workers": 0,
    },
    "unpruned-vocab": {"data.prune_vocab": False},
}

# The sizing fields under each model.size. "cpu" is the defaults (a CPU CI run takes
# seconds); "gpu" is the size measured on an H200 (../shared/gpu-runs/h200-sized/m768l6b256):
# healthy keeps the GPU 82.7 % busy at 34.9 ms a step and 7.2 GiB peak, where the cpu size
# leaves it 3 % busy and every scenario then shows GPU starvation instead of its own fault.
# A scenario preset is applied after the size preset (small-batch's batch of 2 stays 2).
SIZE_PRESETS: dict[str, dict[str, Any]] = {
    "cpu": {
        "model.hidden_size": 192,
        "model.layers": 2,
        "model.heads": 4,
        "model.intermediate_size": 768,
        "train.batch_size": 32,
        "data.max_length": 32,
        "data.num_workers": 1,
    },
    "gpu": {
        "model.hidden_size": 768,
        "model.layers": 6,
        "model.heads": 12,
        "model.intermediate_size": 3072,
        "train.batch_size": 256,
        "data.max_length": 128,
        "data.num_workers": 4,
    },
}


def resolve_size(requested: str, device: str | None) -> str:
    """The size preset a run gets: ``auto`` follows the device (``None``: not known yet,
    e.g. validating a form without torch; ``auto`` then stays ``auto``, cpu values)."""
    if requested != "auto" or device is None:
        return requested
    return "gpu" if device == "cuda" else "cpu"


def split_sizes(rows: int) -> tuple[int, int]:
    """(train, validation) rows of a corpus: the last tenth validates (32 to 512 rows)."""
    val = min(512, max(32, rows // 10))
    return rows - val, val


# --- field introspection -------------------------------------------------------------------

_SECTIONS: tuple[str, ...] = (
    "data",
    "model",
    "train",
    "profiler",
    "instruments",
    "runtime",
    "distributed",
)
_TOP_LEVEL: tuple[str, ...] = ("seed", "device")


def _resolved_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _field_table() -> dict[str, tuple[Any, dataclasses.Field[Any]]]:
    table: dict[str, tuple[Any, dataclasses.Field[Any]]] = {}
    top_hints = _resolved_hints(TrainerConfig)
    top_fields = {f.name: f for f in dataclasses.fields(TrainerConfig)}
    for name in _TOP_LEVEL:
        table[name] = (top_hints[name], top_fields[name])
    for section in _SECTIONS:
        section_cls = top_hints[section]
        hints = _resolved_hints(section_cls)
        for f in dataclasses.fields(section_cls):
            table[f"{section}.{f.name}"] = (hints[f.name], f)
    return table


_FIELDS = _field_table()
_FIELD_TYPES: dict[str, Any] = {key: hint for key, (hint, _) in _FIELDS.items()}


def field_keys() -> list[str]:
    """Every dotted key, in declaration order (``scenario`` excluded)."""
    return list(_FIELDS)


def _optional_inner(hint: Any) -> tuple[Any, bool]:
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        return args[0], len(args) < len(get_args(hint))
    return hint, False


def _describe_type(hint: Any) -> str:
    inner, optional = _optional_inner(hint)
    name = "choice" if get_origin(inner) is Literal else inner.__name__
    return f"{name} or null" if optional else name


def _allowed(key: str) -> str:
    hint, spec = _FIELDS[key]
    inner, optional = _optional_inner(hint)
    if get_origin(inner) is Literal:
        return ", ".join(get_args(inner))
    if inner is bool:
        return "true, false"
    low, high = spec.metadata.get("min"), spec.metadata.get("max")
    kind = "integer" if inner is int else "number"

    def fmt(value: float) -> str:
        return str(int(value)) if kind == "integer" else f"{value:g}"

    if low is not None and high is not None and spec.metadata.get("exclusive_min"):
        text = f"{kind} > {fmt(low)} and <= {fmt(high)}"
    elif low is not None and high is not None:
        text = f"{kind} from {fmt(low)} to {fmt(high)}"
    elif low is not None:
        op = ">" if spec.metadata.get("exclusive_min") else ">="
        text = f"{kind} {op} {fmt(low)}"
    else:
        text = kind
    return text + (" or null" if optional else "")


@dataclass(frozen=True)
class FieldInfo:
    """One config key, for forms and docs."""

    key: str
    type: str  # "int", "float", "bool", "choice", with " or null" when optional
    default: Any
    allowed: str  # human-readable: the choices or the range
    choices: tuple[str, ...] | None
    help: str
    minimum: float | None
    maximum: float | None


def config_fields() -> list[FieldInfo]:
    defaults = TrainerConfig()
    infos = []
    for key, (hint, spec) in _FIELDS.items():
        inner, _ = _optional_inner(hint)
        choices = tuple(get_args(inner)) if get_origin(inner) is Literal else None
        infos.append(
            FieldInfo(
                key=key,
                type=_describe_type(hint),
                default=get_value(defaults, key),
                allowed=_allowed(key),
                choices=choices,
                help=spec.metadata.get("help", ""),
                minimum=spec.metadata.get("min"),
                maximum=spec.metadata.get("max"),
            )
        )
    return infos


# --- values ----------------------------------------------------------------------------------

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
_NULL = {"null", "none", ""}


def coerce(key: str, value: Any) -> Any:
    """``value`` (a CLI string or a JSON value) as the field's type, range-checked."""
    if key not in _FIELDS:
        close = [k for k in _FIELDS if k.split(".")[-1] == key.split(".")[-1]]
        hint = f"did you mean {close[0]}?" if close else "see `python -m trainer run --help`"
        raise ConfigError(key, "unknown key", hint)
    hint, spec = _FIELDS[key]
    inner, optional = _optional_inner(hint)
    allowed = _allowed(key)
    text = value.strip() if isinstance(value, str) else None

    if value is None or (text is not None and text.lower() in _NULL):
        if optional:
            return None
        raise ConfigError(key, "a value is required", allowed)

    if get_origin(inner) is Literal:
        choices = get_args(inner)
        if text is None or text not in choices:
            raise ConfigError(key, f"{value!r} is not one of the choices", allowed)
        return text
    if inner is bool:
        if isinstance(value, bool):
            return value
        if text is not None and text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        raise ConfigError(key, f"{value!r} is not a boolean", allowed)
    if inner is int:
        if isinstance(value, bool):
            raise ConfigError(key, f"{value!r} is not an integer", allowed)
        if isinstance(value, int):
            number: float = value
        elif isinstance(value, float) and value.is_integer():
            number = int(value)
        else:
            try:
                number = int(text) if text is not None else int("x")
            except ValueError:
                raise ConfigError(key, f"{value!r} is not an integer", allowed) from None
    elif inner is float:
        if isinstance(value, bool):
            raise ConfigError(key, f"{value!r} is not a number", allowed)
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(key, f"{value!r} is not a number", allowed) from None
        if number != number or number in (float("inf"), float("-inf")):
            raise ConfigError(key, f"{value!r} is not a finite number", allowed)
    elif inner is str:
        return str(value)
    else:  # pragma: no cover - every field type is handled above
        raise ConfigError(key, f"unsupported field type {inner!r}")

    low, high = spec.metadata.get("min"), spec.metadata.get("max")
    if low is not None:
        too_low = number <= low if spec.metadata.get("exclusive_min") else number < low
        if too_low:
            raise ConfigError(key, f"{value!r} is out of range", allowed)
    if high is not None and number > high:
        raise ConfigError(key, f"{value!r} is out of range", allowed)
    return number


def get_value(config: TrainerConfig, key: str) -> Any:
    target: Any = config
    for part in key.split("."):
        target = getattr(target, part)
    return target


def set_value(config: TrainerConfig, key: str, value: Any) -> None:
    coerced = coerce(key, value)
    *parents, leaf = key.split(".")
    target: Any = config
    for part in parents:
        target = getattr(target, part)
    setattr(target, leaf, coerced)


def parse_assignment(text: str) -> tuple[str, str]:
    """``"train.lr=1e-3"`` -> ``("train.lr", "1e-3")``."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError("--set", f"{text!r} is not key=value", "e.g. --set train.lr=1e-3")
    return key.strip(), value


def validate(config: TrainerConfig) -> None:
    """Checks that involve more than one field (single fields are checked on assignment)."""
    known = {**SCENARIOS, **DISTRIBUTED_SCENARIOS}
    if config.scenario not in known:
        raise ConfigError("scenario", f"{config.scenario!r} is unknown", ", ".join(known))
    if config.model.hidden_size % config.model.heads:
        raise ConfigError(
            "model.heads",
            f"{config.model.heads} does not divide model.hidden_size {config.model.hidden_size}",
            "a divisor of model.hidden_size",
        )
    n_train, _ = split_sizes(config.data.rows)
    if config.train.batch_size > n_train:
        raise ConfigError(
            "train.batch_size",
            f"{config.train.batch_size} is larger than the training split ({n_train} of "
            f"data.rows {config.data.rows})",
            f"<= {n_train}",
        )
    if config.data.dataset == "sharded" and config.data.shards > n_train:
        raise ConfigError(
            "data.shards",
            f"{config.data.shards} shards for {n_train} training rows",
            f"<= {n_train}",
        )


def build_config(
    scenario: str = "healthy",
    overrides: Mapping[str, Any] | Iterable[tuple[str, Any]] = (),
    *,
    steps: int | None = None,
    device: str | None = None,
    resolved_device: str | None = None,
) -> TrainerConfig:
    """Defaults, the size preset, the scenario preset, then the overrides (each checked).

    ``resolved_device`` ("cpu"/"cuda", known once torch is imported at run start) turns
    ``model.size=auto`` into the cpu or gpu preset; without it ``auto`` keeps the defaults
    (the cpu values), which is what a form validated without torch shows.
    """
    known = {**SCENARIOS, **DISTRIBUTED_SCENARIOS}
    if scenario not in known:
        raise ConfigError("scenario", f"{scenario!r} is unknown", ", ".join(known))
    items = list(overrides.items() if isinstance(overrides, Mapping) else overrides)
    requested = "auto"
    for key, value in items:
        if key == "model.size":
            requested = coerce(key, value)
    size = resolve_size(requested, resolved_device)
    config = TrainerConfig(scenario=scenario)
    for key, value in SIZE_PRESETS.get(size, {}).items():
        set_value(config, key, value)
    config.model.size = size  # type: ignore[assignment]
    for key, value in {**SCENARIO_PRESETS, **DISTRIBUTED_PRESETS}[scenario].items():
        set_value(config, key, value)
    for key, value in items:
        if key == "scenario":
            raise ConfigError("scenario", "choose the scenario with --scenario, not --set")
        if key != "model.size":  # resolved above: "auto" must not come back
            set_value(config, key, value)
    if steps is not None:
        set_value(config, "train.steps", steps)
    if device is not None:
        set_value(config, "device", device)
    try:
        validate(config)
    except ConfigError as exc:
        explicit = {key for key, _ in items}
        if exc.key in SIZE_PRESETS.get(size, {}) and exc.key not in explicit:
            # say where the value came from: the user never typed it
            raise ConfigError(
                exc.key, f"{exc.problem} (from the model.size={size} preset)", exc.allowed
            ) from None
        raise
    return config


def validate_overrides(overrides: Mapping[str, Any], scenario: str = "healthy") -> dict[str, str]:
    """Field -> one-line error, for every bad override (empty when all are fine)."""
    errors: dict[str, str] = {}
    good: dict[str, Any] = {}
    for key, value in overrides.items():
        try:
            good[key] = coerce(key, value)
        except ConfigError as exc:
            errors[key] = str(exc)
    if not errors:
        try:
            build_config(scenario, good)
        except ConfigError as exc:
            errors[exc.key] = str(exc)
    return errors
