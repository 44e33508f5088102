"""MFU per step from the trainer's config, and FLOPs utilisation from counted operators.

The parameter count N is checked against the real model (trainer.model built with torch,
its parameters counted); the H200 figures against the run's own steps.jsonl read with json
and the peak from NVIDIA's H200 page (989.5 dense bf16 TFLOP/s); the counted figure against
the roofline's counted FLOPs, which test_roofline_tracelens.py pins to TraceLens."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import polars as pl
import pytest

from diagnostics.analyze import analyze
from diagnostics.facts.mfu import (
    COUNTED_LABEL,
    MODEL_LABEL,
    bert_layer_params,
    bert_mlm_head_params,
    mfu_facts,
    trainer_model_shapes,
)
from diagnostics.metrics import steady_steps
from diagnostics.report import build_report, render_json, render_markdown
from diagnostics.rules import examples as ex
from diagnostics.views import summary_cards

SHARED = Path(__file__).resolve().parents[3].parent / "shared"
SIZED = SHARED / "gpu-runs" / "h200-sized"
H100_QWEN = SHARED / "traces" / "tracelens_h100_qwen1.5-0.5b_infer_profmem.json.gz"
MI300X_QWEN = SHARED / "traces" / "tracelens_mi300x_qwen1.5-0.5b_infer_profmem.json.gz"
H200_BF16_TFLOPS = 989.5

RESNET = SHARED / "traces" / "kineto_resnet50_num_workers_0.pt.trace.json.gz"


def test_the_shared_inputs_are_there():
    # a missing ../shared fails here and in the tests that read it instead of skipping them
    assert (SIZED / "m768l6b256" / "steps.jsonl").is_file(), f"{SIZED}: the shared H200 run"
    for trace in (H100_QWEN, MI300X_QWEN, RESNET):
        assert trace.is_file(), f"{trace}: a shared trace (PROVENANCE.md)"


@pytest.mark.parametrize(
    ("hidden", "layers", "heads", "intermediate", "vocab"),
    [(64, 2, 4, 96, 301), (48, 3, 6, 200, 50)],
)
def test_parameter_counts_are_the_real_models(hidden, layers, heads, intermediate, vocab):
    import torch

    from trainer.config import ModelConfig
    from trainer.model import MultiTaskModel

    model = MultiTaskModel(
        ModelConfig(hidden_size=hidden, layers=layers, heads=heads, intermediate_size=intermediate),
        vocab_size=vocab,
        max_length=16,
        num_categories=10,
        num_merchant_types=5,
        pad_id=0,
    )
    # the parameters a masked-LM step uses are the ones that get a gradient (transformers 5
    # keeps an unused predictions.bias beside the decoder's own bias outside BertForMaskedLM)
    ids = torch.randint(1, vocab, (2, 16))
    model.mlm_loss(ids, torch.ones_like(ids), ids).backward()

    def used(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters() if p.grad is not None)

    assert layers * bert_layer_params(hidden, intermediate) == used(model.backbone.encoder)
    assert bert_mlm_head_params(hidden, vocab) == used(model.mlm_head)


def _steady_records(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]
    by_phase: dict[str, list[dict]] = {}
    for row in sorted(rows, key=lambda r: r["step"]):
        by_phase.setdefault(row["phase"], []).append(row)
    return [r for rows in by_phase.values() for r in (rows[1:] if len(rows) > 2 else rows)]


@pytest.fixture(scope="module")
def m768():
    return analyze(SIZED / "m768l6b256")


def test_h200_mfu_is_six_n_plus_attention_times_tokens_over_step_time_and_the_bf16_peak(m768):
    # run.json: hidden 768, 6 layers, 12 heads, intermediate 3072, 128 tokens, vocab 434.
    # N per layer = 7,087,872 (the torch count above); attention 12·L·H·Q·T = 12·6·768·128
    finetune = 6 * 6 * 7_087_872 + 12 * 6 * 768 * 128
    pretrain = finetune + 6 * (768 * 768 + 3 * 768 + 768 * 434 + 434)  # + masked-LM head
    expected = []
    for record in _steady_records(SIZED / "m768l6b256"):
        per_token = pretrain if record["phase"] == "pretrain" else finetune
        flops = record["batch_size"] * 128 * per_token
        expected.append(100 * flops / (record["step_time_ms"] / 1000) / (H200_BF16_TFLOPS * 1e12))
    assert m768.metrics.mfu_pct == pytest.approx(statistics.median(expected))
    assert 24.0 < m768.metrics.mfu_pct < 26.0  # 34.9 ms a step (PROVENANCE.md)
    model = m768.summary["mfu"]["model"]
    assert model["flops_per_token"] == {"finetune": finetune, "pretrain": pretrain}
    assert (model["precision"], model["peak_tflops"], model["device_peak"]) == (
        "bf16",
        H200_BF16_TFLOPS,
        "H200 SXM",
    )
    assert len(model["steps"]) == len(expected) == 46


def test_h200_counted_flops_of_a_profiled_step_agree_with_the_models(m768):
    # the three profiled steps are fine-tuning steps of 256 x 128 tokens; the operators
    # counted from the shapes must agree with 6N + 12·L·H·Q·T: above it by the attention
    # backward's recomputed QKᵀ (14 against 12 per L·H·Q·T: +0.45 %) and the element-wise
    # work, below it by the bias gradients (2 FLOPs a bias element, not 6)
    model_step = 256 * 128 * (6 * 6 * 7_087_872 + 12 * 6 * 768 * 128)
    counted = m768.summary["mfu"]["counted"]
    assert [s["step"] for s in counted["steps"]] == [2, 3, 4]
    for step in counted["steps"]:
        assert 1.0 < step["flops"] / model_step < 1.02
    # each step's duration is its host ProfilerStep#N range, read from the trace with json
    # (not the analyser's step table, which the figure under test divides by)
    (trace,) = (SIZED / "m768l6b256" / "trace").glob("*.pt.trace.json.gz")
    with gzip.open(trace) as handle:
        events = json.load(handle)["traceEvents"]
    host_us = {
        int(e["name"].removeprefix("ProfilerStep#")): e["dur"]
        for e in events
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    }
    assert sorted(host_us) == [2, 3, 4]  # 39,123 / 37,290 / 37,572 us
    expected = [
        100 * s["flops"] / (host_us[s["step"]] / 1e6) / (H200_BF16_TFLOPS * 1e12)
        for s in counted["steps"]
    ]
    assert m768.metrics.counted_flops_utilization_pct == pytest.approx(statistics.median(expected))
    assert counted["gpu_time_covered_pct"] > 50


@pytest.mark.parametrize(("trace", "peak"), [(H100_QWEN, 989.5), (MI300X_QWEN, 1307.4)])
def test_the_qwen_traces_count_every_counted_call_in_their_one_profiler_step(trace, peak):
    result = analyze(trace)
    roofline = result.facts.roofline
    counted = result.summary["mfu"]["counted"]
    (step,) = counted["steps"]
    assert step["flops"] == roofline.counted_flops
    dur_us = result.facts.steps["dur_us"][0]
    assert counted["median_pct"] == pytest.approx(100 * step["flops"] / dur_us / 1e6 / peak)
    assert counted["precision"] == "bf16" and counted["peak_tflops"] == peak
    # an inference trace: no trainer config, no model FLOPs
    assert result.summary["mfu"]["model"] is None and result.metrics.mfu_pct is None


def test_reports_and_cards_show_both_labelled(m768):
    cards = {card.label: card for card in summary_cards(m768.metrics)}
    # short labels on the cards, the full names first in their help
    assert cards["MFU"].value == "24.9 %"
    assert cards["MFU"].help.startswith(MODEL_LABEL[:1].upper() + MODEL_LABEL[1:] + ": ")
    assert cards["HFU"].value == "23.2 %"
    assert cards["HFU"].help.startswith(COUNTED_LABEL[:1].upper() + COUNTED_LABEL[1:] + ": ")
    report = build_report(m768)
    markdown = render_markdown(report)
    assert f"{MODEL_LABEL} | 24.9 % of the H200 SXM dense bf16 peak" in markdown
    rows = dict(json.loads(render_json(report))["report"]["summary_rows"])
    assert rows[COUNTED_LABEL].startswith("23.2 % of the H200 SXM dense bf16 peak")


def test_an_unknown_gpu_gives_rates_and_no_percentage():
    config = {
        "model": {"hidden_size": 64, "layers": 2, "heads": 4, "intermediate_size": 128},
        "data": {"max_length": 16},
        "train": {"amp": "bf16"},
    }
    run = ex.run(
        ex.series(5, step_time_ms=10.0, batch_size=8, phase="finetune"),
        config=config,
        environment={"device": "cuda", "gpu_name": "NVIDIA Imaginary X1"},
    )
    mfu = mfu_facts(None, run, steady_steps(run.steps)).model
    assert mfu is not None and mfu.median_pct is None
    assert "no dense bf16 peak" in (mfu.unknown_reason or "")
    per_token = 6 * 2 * bert_layer_params(64, 128) + 12 * 2 * 64 * 16
    assert mfu.median_tflops_per_s == pytest.approx(8 * 16 * per_token / 0.010 / 1e12)


def test_a_cpu_run_has_no_mfu_and_no_flops_cards():
    run = ex.run(
        ex.series(5, step_time_ms=10.0, batch_size=8, phase="finetune"),
        config={
            "model": {"hidden_size": 64, "layers": 2, "heads": 4, "intermediate_size": 128},
            "data": {"max_length": 16},
        },
        environment=ex.CPU_ENV,
    )
    inputs = ex.inputs(run=run)
    assert inputs.metrics.mfu_pct is None and inputs.metrics.counted_flops_utilization_pct is None
    assert mfu_facts(None, run, steady_steps(run.steps)).model is None
    assert len(summary_cards(inputs.metrics)) == 6


def test_shapes_need_every_sizing_key_and_heads_that_divide_the_width():
    full = {
        "model": {"hidden_size": 64, "layers": 2, "heads": 4, "intermediate_size": 128},
        "data": {"max_length": 16},
    }
    assert set(trainer_model_shapes(full, {}) or {}) == {"finetune"}  # no vocabulary: no MLM
    assert set(trainer_model_shapes(full, {"vocab_usage": {"vocab_size": 100}}) or {}) == {
        "finetune",
        "pretrain",
    }
    assert trainer_model_shapes({**full, "data": {}}, {}) is None
    bad = {**full, "model": {**full["model"], "heads": 5}}
    assert trainer_model_shapes(bad, {}) is None


def test_counted_figure_is_unknown_when_counted_operators_hold_little_gpu_time():
    # ResNet-50 on a V100: its convolutions are aten::cudnn_convolution, which the FLOP
    # model has no formula for; the counted calls ran ~10 % of the GPU time
    result = analyze(RESNET)
    counted = result.summary["mfu"]["counted"]
    assert counted["gpu_time_covered_pct"] < 50
    assert counted["median_pct"] is None and result.metrics.counted_flops_utilization_pct is None
    assert all(s["pct"] is None for s in counted["steps"])
    assert "no FLOP count" in counted["unknown_reason"]
    assert pl.Series([s["tflops_per_s"] for s in counted["steps"]]).min() > 0


# A script run (pipeline-doctor profile) whose HF Trainer callback recorded the model: a
# GPT-2-small-sized shape. Figures by hand: each steady step's tokens x (6N + 12·L·H·Q·seq_len)
# over its step time and the dense peak of the run's precision.
SCRIPT_N, SCRIPT_L, SCRIPT_H, SCRIPT_Q = 124_318_464, 12, 12, 64
# NVIDIA's H100 SXM datasheet, dense (sparse figures halved): the peak table's row
H100_BF16_TFLOPS = H100_FP16_TFLOPS = 989.5
H100_TF32_TFLOPS, H100_FP32_TFLOPS = 494.5, 67.0
SCRIPT_TOKENS = [4096, 7800, 8100, 6000, 8192, 7000]
SCRIPT_SEQ_LEN = [512.0, 487.5, 506.25, 375.0, 512.0, 437.5]
SCRIPT_MS = [900.0, 60.0, 62.0, 47.0, 64.0, 55.0]


def _script_run(
    *,
    amp=None,
    shape_extra=None,
    model_shape=True,
    gpu="NVIDIA H100 80GB HBM3",
    **columns,
):
    shape = {
        "source": "hf_trainer",
        "model_type": "gpt2",
        "non_embedding_params": SCRIPT_N,
        "layers": SCRIPT_L,
        "heads": SCRIPT_H,
        "head_dim": SCRIPT_Q,
        "vocab_size": 50257,
        "parameter_dtype": "float32",
        "fp32_matmul": "ieee",
        **(shape_extra or {}),
    }
    extra = {"kind": "script"}
    if model_shape:
        extra["model_shape"] = shape
    if amp is not False:
        amp = amp or {"autocast_dtypes": ["cuda:bfloat16"], "grad_scaler": False}
        extra["amp"] = {**amp, "skipped_steps": 0}
    steps = {
        "phase": "train",
        "step_time_ms": SCRIPT_MS,
        "tokens": SCRIPT_TOKENS,
        "seq_len": SCRIPT_SEQ_LEN,
        "batch_size": 16,
        **columns,
    }
    return ex.run(
        ex.series(len(SCRIPT_MS), **steps),
        environment={"device": "cuda", "gpu_name": gpu},
        extra=extra,
    )


STEADY = (1, 2, 3, 4, 5)  # indices of steps 2-6: the first step is not steady


def _hand_pcts(peak_tflops, steps=STEADY):
    pcts = []
    for i in steps:
        per_token = 6 * SCRIPT_N + 12 * SCRIPT_L * SCRIPT_H * SCRIPT_Q * SCRIPT_SEQ_LEN[i]
        flops = SCRIPT_TOKENS[i] * per_token
        pcts.append(100 * flops / (SCRIPT_MS[i] / 1000) / (peak_tflops * 1e12))
    return pcts


def test_a_script_runs_mfu_is_its_real_tokens_times_the_recorded_model_over_the_bf16_peak():
    run = _script_run()
    model = mfu_facts(None, run, steady_steps(run.steps)).model
    assert model is not None and model.unknown_reason is None
    expected = _hand_pcts(H100_BF16_TFLOPS)
    assert [s.step for s in model.steps] == [2, 3, 4, 5, 6]
    assert [s.pct for s in model.steps] == pytest.approx(expected)
    assert model.median_pct == pytest.approx(statistics.median(expected))
    # step 2: 7800 x (6 x 124,318,464 + 12·12·12·64 x 487.5) = 7800 x 799,824,384 FLOPs
    assert model.steps[0].flops == pytest.approx(7800 * 799_824_384)
    assert model.steps[0].pct == pytest.approx(100 * 7800 * 799_824_384 / 0.060 / 989.5e12)
    assert 10.0 < model.median_pct < 11.0
    assert (model.precision, model.peak_tflops, model.device) == (
        "bf16",
        H100_BF16_TFLOPS,
        "H100 SXM",
    )
    assert model.label == "MFU (model FLOPs from the HF Trainer's model)"
    assert "6N + 12·L·H·Q·T" in model.source and "HF Trainer" in model.source
    assert "real tokens" in model.source and "model_shape" in model.source
    # the steps' FLOPs over their tokens, one figure for the phase
    total_flops = sum(s.flops for s in model.steps)
    assert model.flops_per_token == {"train": round(total_flops / sum(SCRIPT_TOKENS[1:]))}


def test_a_script_runs_figure_shows_in_the_cards_and_report_rows_under_its_label():
    from diagnostics.report.sections import mfu_rows

    run = _script_run()
    inputs = ex.inputs(run=run)
    label = "MFU (model FLOPs from the HF Trainer's model)"
    assert inputs.metrics.mfu_label == label
    assert inputs.metrics.mfu_pct == pytest.approx(statistics.median(_hand_pcts(H100_BF16_TFLOPS)))
    cards = {card.label: card for card in summary_cards(inputs.metrics)}
    assert cards["MFU"].value == f"{inputs.metrics.mfu_pct:.1f} %"
    assert cards["MFU"].help.startswith(label + ": ")  # where its model FLOPs came from
    summary = {"mfu": mfu_facts(None, run, steady_steps(run.steps)).to_summary()}
    ((row_label, text),) = mfu_rows(summary)
    assert row_label == label
    assert text.startswith(f"{inputs.metrics.mfu_pct:.1f} % of the H100 SXM dense bf16 peak")


@pytest.mark.parametrize(
    ("amp", "shape_extra", "precision", "peak"),
    [
        (
            {"autocast_dtypes": ["cuda:float16"], "grad_scaler": True},
            None,
            "fp16",
            H100_FP16_TFLOPS,
        ),
        # no autocast: the parameters' dtype decides (a model loaded in bf16)
        ({"autocast_dtypes": []}, {"parameter_dtype": "bfloat16"}, "bf16", H100_BF16_TFLOPS),
        ({"autocast_dtypes": []}, None, "fp32", H100_FP32_TFLOPS),
        ({"autocast_dtypes": []}, {"fp32_matmul": "tf32"}, "tf32", H100_TF32_TFLOPS),
        # autocast on the CPU is not the GPU's precision
        ({"autocast_dtypes": ["cpu:bfloat16"]}, None, "fp32", H100_FP32_TFLOPS),
    ],
)
def test_a_script_runs_precision_is_its_cuda_autocast_else_its_parameters(
    amp, shape_extra, precision, peak
):
    run = _script_run(amp=amp, shape_extra=shape_extra)
    model = mfu_facts(None, run, steady_steps(run.steps)).model
    assert model is not None and (model.precision, model.peak_tflops) == (precision, peak)
    assert model.median_pct == pytest.approx(statistics.median(_hand_pcts(peak)))


@pytest.mark.parametrize(
    ("amp", "shape_extra", "says"),
    [
        (False, None, "no AMP summary"),
        ({"autocast_dtypes": ["cuda:bfloat16", "cuda:float16"]}, None, "bfloat16 and float16"),
        ({"autocast_dtypes": []}, {"parameter_dtype": None}, "dtype is not recorded"),
        ({"autocast_dtypes": []}, {"fp32_matmul": None}, "TF32 is not recorded"),
    ],
)
def test_a_script_run_whose_precision_cannot_be_told_has_rates_and_no_percentage(
    amp, shape_extra, says
):
    run = _script_run(amp=amp, shape_extra=shape_extra)
    model = mfu_facts(None, run, steady_steps(run.steps)).model
    assert model is not None and model.median_pct is None and model.precision is None
    assert says in (model.unknown_reason or ""), model.unknown_reason
    assert all(s.pct is None for s in model.steps)
    per_token = 6 * SCRIPT_N + 12 * SCRIPT_L * SCRIPT_H * SCRIPT_Q * SCRIPT_SEQ_LEN[1]
    assert model.steps[0].tflops_per_s == pytest.approx(7800 * per_token / 0.060 / 1e12)
    assert ex.inputs(run=run).metrics.mfu_pct is None


def test_a_script_run_on_an_unknown_gpu_says_there_is_no_peak():
    run = _script_run(gpu="NVIDIA Imaginary X1")
    model = mfu_facts(None, run, steady_steps(run.steps)).model
    assert model is not None and model.median_pct is None
    assert "no dense bf16 peak" in (model.unknown_reason or "")


def test_a_script_run_without_a_recorded_model_or_tokens_has_no_mfu():
    run = _script_run(model_shape=False)
    assert mfu_facts(None, run, steady_steps(run.steps)).model is None
    assert ex.inputs(run=run).metrics.mfu_pct is None
    # no batch with input_ids: no tokens, no figure
    run = _script_run(tokens=None, seq_len=None)
    assert mfu_facts(None, run, steady_steps(run.steps)).model is None
    # a shape with a size that is not a positive integer is no shape
    run = _script_run(shape_extra={"heads": 0})
    assert mfu_facts(None, run, steady_steps(run.steps)).model is None


def test_a_script_runs_forward_only_and_tokenless_steps_are_left_out():
    # steps 3 and 5 fetched batches before any optimizer step (phase batches: forward
    # only) or batches without input_ids
    tokens = [*SCRIPT_TOKENS[:4], None, SCRIPT_TOKENS[5]]
    phase = ["train", "train", "batches", "train", "train", "train"]
    run = _script_run(tokens=tokens, phase=phase)
    model = mfu_facts(None, run, steady_steps(run.steps)).model
    assert model is not None and [s.step for s in model.steps] == [2, 4, 6]
    assert [s.pct for s in model.steps] == pytest.approx(
        _hand_pcts(H100_BF16_TFLOPS, steps=[1, 3, 5])
    )
