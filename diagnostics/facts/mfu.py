"""FLOPs utilisation per step, two ways, each over the device's dense peak (facts.peaks).

Model FLOPs utilisation (MFU), from the model's config
    Model FLOPs per token for a forward and backward pass, PaLM (Chowdhery et al. 2022,
    appendix B) after Megatron-LM (Narayanan et al. 2021): ``6N + 12·L·H·Q·T``. N is the
    number of parameters that act on every token, embedding tables left out (a lookup
    does no arithmetic); 6 = 2 FLOPs per multiply-add x (forward + two backward products).
    12·L·H·Q·T is the attention's QKᵀ and PV over a sequence of T tokens (L layers, H
    heads, Q head dimension), which no parameter stands for. A step's model FLOPs are its
    tokens times that; MFU = model FLOPs / step time / peak. Recomputation, padding and
    work the formula does not know are not counted: MFU is what the model needed, not
    what the GPU did.

    A reference-trainer run's N, L, H, Q come from its config and its tokens are batch x
    ``data.max_length``. A script run's come from the model its HF Trainer trained (run.json
    ``model_shape``, recorded by the probe's callback: probe/model_shape.py) and each step
    record's ``tokens`` (real tokens, padding left out) and ``seq_len`` (their token-weighted
    mean padded length, the T of the attention term).

Hardware FLOPs utilisation from counted operators
    The roofline's counted FLOPs (facts.roofline: every innermost modelled operator call
    once, forward and backward, from the shapes the trace recorded) of each profiler step
    over that step's time, over the peak. It counts what ran: FlashAttention's recomputed
    QKᵀ in the backward, the element-wise work, padded tokens; so it is above MFU where
    those are large, and it only covers the profiler's few steps.

The peak is the dense matrix peak of the run's precision for MFU (a trainer run's
``train.amp``: bf16 or fp16; fp32 without autocast, TF32's figure with ``train.tf32``; a script
run's CUDA autocast dtype, else its parameters' dtype, fp32 ones at TF32's figure where the
run allowed it: see :func:`script_run_precision`), and of the precision most of the counted
matrix FLOPs ran in for the counted figure. A CPU run or a device with no row
in the peak table has no peak: both figures are then None, never a guess.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import polars as pl

from diagnostics.dotted import dotted_get
from diagnostics.facts.device import DeviceIdentity, identify_device
from diagnostics.facts.flop_args import MATRIX_KINDS
from diagnostics.facts.peaks import device_peak

if TYPE_CHECKING:
    from diagnostics.sources import RunData, TraceFacts

MODEL_FLOPS_SOURCE = (
    "6N + 12·L·H·Q·T per token: PaLM (Chowdhery et al. 2022) appendix B, after Megatron-LM "
    "(Narayanan et al. 2021)"
)
MODEL_LABEL = "MFU (model FLOPs from the config)"
# a script run's figure, by run.json model_shape's ``source``: the label and where the shape
# came from, for the figure's ``source``
RECORDED_SHAPE_SOURCES: dict[str, tuple[str, str]] = {
    "hf_trainer": (
        "MFU (model FLOPs from the HF Trainer's model)",
        "N, L, H, Q of the model the script's HF Trainer trained, read by the probe's "
        "callback at on_train_begin (run.json model_shape)",
    ),
}
COUNTED_LABEL = "hardware FLOPs utilisation (counted operators)"
# below this share of GPU busy time in counted operator calls, the counted figure is a floor
# of unknown distance from the truth, not a utilisation
COUNTED_MIN_COVERAGE_PCT = 50.0


@dataclass(frozen=True)
class ModelShape:
    """What ``6N + 12·L·H·Q·T`` reads, for one kind of step."""

    non_embedding_params: int  # N: parameters applied to every token
    layers: int  # L
    heads: int  # H
    head_dim: int  # Q
    seq_len: int  # T: tokens a sequence attends over

    @property
    def flops_per_token(self) -> int:
        return 6 * self.non_embedding_params + 12 * (
            self.layers * self.heads * self.head_dim * self.seq_len
        )


def bert_layer_params(hidden: int, intermediate: int) -> int:
    """One BERT encoder layer (transformers' BertLayer): Q, K, V and the attention output
    (4·(h² + h)), two LayerNorms (2·2h), the feed-forward in and out (h·i + i + i·h + h)."""
    return (
        4 * (hidden * hidden + hidden)
        + 4 * hidden
        + 2 * hidden * intermediate
        + intermediate
        + hidden
    )


def bert_mlm_head_params(hidden: int, vocab: int) -> int:
    """BertOnlyMLMHead: the transform (h² + h, LayerNorm 2h) and the decoder (h·V + V)."""
    return hidden * hidden + 3 * hidden + hidden * vocab + vocab


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def trainer_model_shapes(
    config: Mapping[str, Any], environment: Mapping[str, Any]
) -> dict[str, ModelShape] | None:
    """The reference trainer's model (trainer/model.py) per phase: ``finetune`` runs the
    encoder on every token (the task heads read one [CLS] vector a sample: 15 outputs of
    hidden width, under a millionth of the encoder's work, left out as the formula does);
    ``pretrain`` adds the masked-LM head on every token, its decoder as wide as the
    model's vocabulary (``vocab_usage.vocab_size`` after pruning, plus its
    ``padding_rows``).
    None when a sizing key is missing; no pretrain entry without the vocabulary."""
    hidden = _positive_int(dotted_get(config, "model.hidden_size"))
    layers = _positive_int(dotted_get(config, "model.layers"))
    heads = _positive_int(dotted_get(config, "model.heads"))
    intermediate = _positive_int(dotted_get(config, "model.intermediate_size"))
    seq_len = _positive_int(dotted_get(config, "data.max_length"))
    if None in (hidden, layers, heads, intermediate, seq_len) or hidden % heads:  # type: ignore[operator]
        return None
    assert hidden and layers and heads and intermediate and seq_len
    encoder = layers * bert_layer_params(hidden, intermediate)
    shapes = {"finetune": ModelShape(encoder, layers, heads, hidden // heads, seq_len)}
    usage = environment.get("vocab_usage")
    vocab = _positive_int(usage.get("vocab_size")) if isinstance(usage, Mapping) else None
    if vocab is not None and isinstance(usage, Mapping):
        # the decoder is as wide as the padded rows (model.pad_vocab_to_multiple_of)
        vocab += _positive_int(usage.get("padding_rows")) or 0
        mlm = encoder + bert_mlm_head_params(hidden, vocab)
        shapes["pretrain"] = ModelShape(mlm, layers, heads, hidden // heads, seq_len)
    return shapes


def run_precision(config: Mapping[str, Any]) -> str:
    """The matrix precision of a trainer run on CUDA: its autocast dtype, else fp32 (TF32's
    figure when ``train.tf32`` allowed it)."""
    amp = dotted_get(config, "train.amp")
    if amp in ("bf16", "fp16"):
        return str(amp)
    return "tf32" if dotted_get(config, "train.tf32") is True else "fp32"


@dataclass(frozen=True)
class RecordedShape:
    """A script run's model as run.json ``model_shape`` holds it: ``6N + 12·L·H·Q·T`` with
    the sequence length T each step's own (its ``seq_len``)."""

    non_embedding_params: int
    layers: int
    heads: int
    head_dim: int
    source: str

    def flops_per_token(self, seq_len: float) -> float:
        return 6 * self.non_embedding_params + 12 * (
            self.layers * self.heads * self.head_dim * seq_len
        )


def recorded_model_shape(extra: Mapping[str, Any]) -> RecordedShape | None:
    """run.json's ``model_shape`` (a script run's manifest extra), or None when it is
    absent or a sizing field is not a positive integer."""
    shape = extra.get("model_shape")
    if not isinstance(shape, Mapping):
        return None
    sizes = [
        _positive_int(shape.get(name))
        for name in ("non_embedding_params", "layers", "heads", "head_dim")
    ]
    if None in sizes:
        return None
    params, layers, heads, head_dim = sizes
    assert params and layers and heads and head_dim
    return RecordedShape(params, layers, heads, head_dim, str(shape.get("source") or "unknown"))


# the autocast dtypes and parameter dtypes torch names, as the peak table's precisions
_TORCH_PRECISIONS = {"bfloat16": "bf16", "float16": "fp16"}


def script_run_precision(amp: Any, shape: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The matrix precision of a script run on CUDA, or None and why it cannot be told.

    CUDA autocast's dtype (run.json ``amp.autocast_dtypes``, as the probe saw autocast
    entered) decides: bf16 or fp16. Without CUDA autocast the parameters' dtype does
    (``model_shape.parameter_dtype``: a model loaded in bf16 runs bf16 matmuls without
    autocast), fp32 ones at TF32's figure when fp32 matmuls were allowed TF32
    (``model_shape.fp32_matmul``). Unknown: no AMP summary (the process did not end the
    way the probe writes it), autocast in two dtypes, a setting not recorded."""
    dtypes = amp.get("autocast_dtypes") if isinstance(amp, Mapping) else None
    if not isinstance(dtypes, list):
        return None, (
            "the run recorded no AMP summary (run.json amp, written as the script ends), "
            "so whether its matmuls ran under autocast is unknown"
        )
    on_cuda = sorted({str(d).partition(":")[2] for d in dtypes if str(d).startswith("cuda:")})
    if len(on_cuda) > 1:
        both = " and ".join(on_cuda)
        return None, f"autocast ran in {both}: which one the steps' matmuls ran in is unknown"
    if on_cuda:
        precision = _TORCH_PRECISIONS.get(on_cuda[0])
        if precision is None:
            return None, f"autocast ran in {on_cuda[0]}: no peak precision for it"
        return precision, None
    dtype = shape.get("parameter_dtype")
    if dtype in _TORCH_PRECISIONS:
        return _TORCH_PRECISIONS[dtype], None
    if dtype != "float32":
        return None, f"no CUDA autocast and the parameters' dtype is {dtype or 'not recorded'}"
    matmul = shape.get("fp32_matmul")
    if matmul == "tf32":
        return "tf32", None
    if matmul == "ieee":
        return "fp32", None
    return (
        None,
        "fp32 parameters without autocast, and whether their matmuls used TF32 is not recorded",
    )


def run_device_identity(environment: Mapping[str, Any]) -> DeviceIdentity | None:
    """The GPU a run recorded (``gpu_name``, ``gpu_compute_capability``); None on CPU."""
    name = environment.get("gpu_name")
    if str(environment.get("device") or "").lower() != "cuda" or not isinstance(name, str):
        return None
    props: dict[str, Any] = {"name": name}
    major, _, minor = str(environment.get("gpu_compute_capability") or "").partition(".")
    if major.isdigit():
        props["computeMajor"], props["computeMinor"] = int(major), int(minor or 0)
    return identify_device([props])


@dataclass(frozen=True)
class StepUtilisation:
    step: int | None  # None: a profiler step whose name carries no number
    phase: str | None
    step_time_ms: float
    flops: float  # model FLOPs (MFU) or counted FLOPs (counted figure) of the step
    tflops_per_s: float
    pct: float | None  # of the peak; None without one


@dataclass(frozen=True)
class Utilisation:
    """One of the two figures: per step, their median, and what it was measured against."""

    kind: str  # "model" | "counted"
    label: str
    precision: str | None
    peak_tflops: float | None
    device: str | None  # the peak table's row, or None
    steps: tuple[StepUtilisation, ...]
    source: str  # how the FLOPs were found
    flops_per_token: dict[str, int] | None = None  # model: per phase
    # counted: the share of the steps' GPU busy time inside the counted calls, %
    gpu_time_covered_pct: float | None = None
    # why the percentage is unknown although rates exist (an unknown device, operators the
    # FLOP model does not cover); None when it is known
    unknown_reason: str | None = None

    @property
    def median_pct(self) -> float | None:
        if self.unknown_reason is not None:
            return None
        values = [s.pct for s in self.steps if s.pct is not None]
        return float(statistics.median(values)) if values else None

    @property
    def peak_basis(self) -> str | None:
        """What the percentages are of ("H200 SXM dense bf16 989.5 TFLOP/s"): two figures are
        comparable only on the same basis (24 % of a bf16 peak is more work than 65 % of the
        fp32 one)."""
        if self.device is None or self.peak_tflops is None:
            return None
        return f"{self.device} dense {self.precision} {self.peak_tflops:g} TFLOP/s"

    @property
    def median_tflops_per_s(self) -> float | None:
        values = [s.tflops_per_s for s in self.steps]
        return float(statistics.median(values)) if values else None

    def to_summary(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "median_pct": self.median_pct,
            "median_tflops_per_s": self.median_tflops_per_s,
            "precision": self.precision,
            "peak_tflops": self.peak_tflops,
            "device_peak": self.device,
            "source": self.source,
            "flops_per_token": self.flops_per_token,
            "gpu_time_covered_pct": self.gpu_time_covered_pct,
            "unknown_reason": self.unknown_reason,
            "steps": [asdict(s) for s in self.steps],
        }


def _step(
    step: int | None, phase: str | None, ms: float, flops: float, peak: float | None
) -> StepUtilisation:
    rate = flops / (ms / 1000.0) / 1e12
    return StepUtilisation(step, phase, ms, flops, rate, 100.0 * rate / peak if peak else None)


def _positive_finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def script_model_utilisation(
    run: RunData, steady: pl.DataFrame, identity: DeviceIdentity | None
) -> Utilisation | None:
    """MFU of a script run's steady step records from the model run.json ``model_shape``
    recorded: each training step's ``tokens`` x (6N + 12·L·H·Q·``seq_len``). Steps without
    tokens (no batch with ``input_ids``) and forward-only ``batches`` steps (6N is a
    training step's) are left out. None without a shape or a step with tokens. The rates
    stand when the precision cannot be told; the percentage is then unknown, with why."""
    shape = recorded_model_shape(run.manifest.extra)
    if shape is None:
        return None
    precision, reason = script_run_precision(
        run.manifest.extra.get("amp"), run.manifest.extra["model_shape"]
    )
    peak_row = device_peak(identity) if identity is not None else None
    peak = peak_row.tflops(precision) if peak_row is not None and precision else None
    if reason is None and peak is None:
        reason = _no_peak_reason(_describe(identity), precision)
    rows: list[StepUtilisation] = []
    tokens_by_phase: dict[str, int] = {}
    flops_by_phase: dict[str, float] = {}
    for record in steady.iter_rows(named=True):
        ms, tokens, seq_len = record["step_time_ms"], record.get("tokens"), record.get("seq_len")
        phase = record.get("phase") or "train"
        if phase == "batches" or not _positive_finite(ms) or not _positive_finite(seq_len):
            continue
        if not isinstance(tokens, int) or tokens <= 0:
            continue
        flops = tokens * shape.flops_per_token(seq_len)
        rows.append(_step(int(record["step"]), phase, float(ms), flops, peak))
        tokens_by_phase[phase] = tokens_by_phase.get(phase, 0) + tokens
        flops_by_phase[phase] = flops_by_phase.get(phase, 0.0) + flops
    if not rows:
        return None
    label, shape_source = RECORDED_SHAPE_SOURCES.get(
        shape.source,
        (
            "MFU (model FLOPs from the recorded model)",
            f"N, L, H, Q from run.json model_shape (source {shape.source!r})",
        ),
    )
    return Utilisation(
        kind="model",
        label=label,
        precision=precision,
        peak_tflops=peak,
        device=peak_row.device if peak_row is not None and peak is not None else None,
        steps=tuple(rows),
        source=(
            f"{MODEL_FLOPS_SOURCE}, times each step's real tokens (padding left out), T their "
            f"token-weighted mean padded length (step records: tokens, seq_len); "
            f"{shape_source}"
        ),
        # seq_len differs between steps: the steps' FLOPs over their tokens, per phase
        flops_per_token={
            phase: round(flops_by_phase[phase] / tokens_by_phase[phase]) for phase in flops_by_phase
        },
        unknown_reason=reason,
    )


def model_utilisation(
    run: RunData, steady: pl.DataFrame, identity: DeviceIdentity | None
) -> Utilisation | None:
    """MFU of a run's steady ``steady`` step records (metrics.steady_steps). A reference-
    trainer run's: each step's batch x sequence length tokens times its phase's FLOPs per
    token, None for a config without the model's sizes; a script run's:
    :func:`script_model_utilisation`."""
    if steady.height == 0:
        return None
    if run.kind == "script":
        return script_model_utilisation(run, steady, identity)
    shapes = trainer_model_shapes(run.config, run.environment)
    if shapes is None:
        return None
    precision = run_precision(run.config)
    peak_row = device_peak(identity) if identity is not None else None
    peak = peak_row.tflops(precision) if peak_row is not None else None
    rows: list[StepUtilisation] = []
    for record in steady.iter_rows(named=True):
        ms, batch = record.get("step_time_ms"), record.get("batch_size")
        phase = record.get("phase") or "finetune"
        shape = shapes.get(phase)
        if (
            shape is None
            or not isinstance(batch, int)
            or not ms
            or not math.isfinite(ms)
            or ms <= 0
        ):
            continue
        tokens = batch * shape.seq_len
        rows.append(
            _step(int(record["step"]), phase, float(ms), tokens * shape.flops_per_token, peak)
        )
    if not rows:
        return None
    reason = None if peak is not None else _no_peak_reason(_describe(identity), precision)
    return Utilisation(
        kind="model",
        label=MODEL_LABEL,
        precision=precision,
        peak_tflops=peak,
        device=peak_row.device if peak_row is not None and peak is not None else None,
        steps=tuple(rows),
        source=MODEL_FLOPS_SOURCE,
        flops_per_token={phase: shape.flops_per_token for phase, shape in shapes.items()},
        unknown_reason=reason,
    )


def dominant_matrix_precision(calls: pl.DataFrame) -> str | None:
    """The precision most counted matrix FLOPs (GEMM, convolution, attention) ran in."""
    matrix = calls.filter(
        pl.col("counted")
        & pl.col("kind").is_in(list(MATRIX_KINDS))
        & pl.col("precision").is_not_null()
    )
    if matrix.height == 0:
        return None
    by = (
        matrix.group_by("precision")
        .agg(pl.col("flops").sum())
        .sort(["flops", "precision"], descending=[True, False])
    )
    return str(by["precision"][0])


def _no_peak_reason(identity_text: str | None, precision: str | None) -> str:
    device = identity_text or "this device"
    return f"no dense {precision or 'matrix'} peak is known for {device} (docs/ROOFLINE.md's table)"


def counted_utilisation(trace: TraceFacts) -> Utilisation | None:
    """The counted operators' FLOPs of each profiler step (the calls that started inside
    its host range) over its duration. None without a roofline or steps. The percentage is
    unknown when the counted calls hold less than COUNTED_MIN_COVERAGE_PCT of the steps'
    GPU busy time: the rest ran in operators the FLOP model has no formula for (cuDNN's
    own convolution operators, compiled graphs), and a figure without them would read as
    a utilisation when it is only a floor."""
    roofline = trace.roofline
    if roofline is None or trace.steps.height == 0:
        return None
    counted = roofline.calls.filter(pl.col("counted"))
    precision = dominant_matrix_precision(roofline.calls)
    peak = roofline.peak.tflops(precision) if roofline.peak is not None else None
    steps = trace.steps
    start = "host_start_us" if "host_start_us" in steps.columns else "start_us"
    end = "host_end_us" if "host_end_us" in steps.columns else "end_us"
    rows = []
    covered_us = 0.0
    for record in steps.iter_rows(named=True):
        lo, hi, dur = record.get(start), record.get(end), record.get("dur_us")
        if lo is None or hi is None or not dur or dur <= 0:
            continue
        inside = counted.filter((pl.col("start_us") >= lo) & (pl.col("start_us") < hi))
        flops = float(inside["flops"].sum())
        covered_us += float(inside["gpu_us"].fill_null(0.0).sum())
        if flops > 0:
            number = record.get("step")
            rows.append(
                _step(None if number is None else int(number), None, dur / 1000.0, flops, peak)
            )
    if not rows:
        return None
    busy = float(trace.gpu["busy_us"].sum()) if trace.gpu.height else 0.0
    coverage = min(100.0, 100.0 * covered_us / busy) if busy > 0 else None
    reason = None
    if peak is None:
        reason = _no_peak_reason(_describe(trace.device_identity), precision)
    elif coverage is None or coverage < COUNTED_MIN_COVERAGE_PCT:
        shown = "unknown" if coverage is None else f"{coverage:.1f} %"
        reason = (
            f"the operators the FLOP model counts ran {shown} of the steps' GPU busy time "
            f"(needs {COUNTED_MIN_COVERAGE_PCT:.0f} %): the rest has no FLOP count"
        )
    if reason is not None:
        rows = [replace(r, pct=None) for r in rows]
    return Utilisation(
        kind="counted",
        label=COUNTED_LABEL,
        precision=precision,
        peak_tflops=peak,
        device=roofline.peak.device if roofline.peak is not None and peak is not None else None,
        steps=tuple(rows),
        source="the roofline's counted operator FLOPs (docs/ROOFLINE.md) per profiler step",
        gpu_time_covered_pct=coverage,
        unknown_reason=reason,
    )


def _describe(identity: DeviceIdentity | None) -> str | None:
    return identity.describe() if identity is not None and identity.vendor else None


@dataclass(frozen=True)
class MfuFacts:
    # from the config (a reference-trainer run) or the recorded model_shape (a script run)
    model: Utilisation | None
    counted: Utilisation | None  # from the trace's operators

    def to_summary(self) -> dict[str, Any]:
        return {
            "model": self.model.to_summary() if self.model is not None else None,
            "counted": self.counted.to_summary() if self.counted is not None else None,
        }


def mfu_facts(
    trace: TraceFacts | None, run: RunData | None, steady: pl.DataFrame | None
) -> MfuFacts:
    """Both figures where their inputs exist. ``steady``: the run's steady-state step
    records. The device is the trace's (deviceProperties) when there is a CUDA trace, else
    the one the run recorded."""
    identity = None
    if trace is not None and trace.device == "cuda" and trace.device_identity is not None:
        identity = trace.device_identity
    if identity is None and run is not None:
        identity = run_device_identity(run.environment)
    model = None
    if run is not None and steady is not None:
        device = str(run.environment.get("device") or dotted_get(run.config, "device") or "")
        # a CPU run has no peak: no figure at all rather than rates nobody can place
        if device.lower() == "cuda":
            model = model_utilisation(run, steady, identity)
    counted = counted_utilisation(trace) if trace is not None and trace.device == "cuda" else None
    return MfuFacts(model=model, counted=counted)
