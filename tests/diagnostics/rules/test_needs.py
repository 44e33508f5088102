"""A rule's ``needs`` are the one declaration of what it requires: they gate the rule
(``skip_reason``) and document it (the rule reference), so the two cannot drift apart."""

from __future__ import annotations

import pytest

from diagnostics.model import AnalysisInputs
from diagnostics.rules import examples as ex
from diagnostics.rules.base import (
    TRACE,
    Need,
    Rule,
    Severity,
    need_any,
    need_cuda,
    need_cuda_trace,
    need_run_steps,
)
from diagnostics.rules.docs import render_markdown, rule_doc
from diagnostics.rules.registry import RULES
from diagnostics.rules.worker_restarts import WorkerRestarts

BARE = ex.inputs()
CPU_RUN = ex.inputs(run=ex.run(ex.series(3, step_time_ms=10.0), environment=ex.CPU_ENV))
CUDA_RUN = ex.inputs(run=ex.run(ex.series(3, step_time_ms=10.0), environment=ex.CUDA_ENV))
CPU_TRACE = ex.inputs(trace=ex.trace("cpu"))
CUDA_TRACE = ex.inputs(trace=ex.trace("cuda"))


def test_every_rule_declares_its_needs_and_none_writes_its_own_skip_reason():
    for rule in RULES:
        assert rule.needs and all(isinstance(n, Need) for n in rule.needs), rule.id
        assert "skip_reason" not in type(rule).__dict__, f"{rule.id} overrides skip_reason"


def test_bare_inputs_skip_every_rule_with_its_first_need():
    for rule in RULES:
        reason = rule.skip_reason(BARE)
        assert reason is not None and reason == rule.needs[0].reason(BARE), rule.id


def test_the_reference_lists_each_rules_needs_in_order():
    text = render_markdown()
    for rule in RULES:
        section = text.split(f"\n## {rule.id}\n", 1)[1].split("\n## ", 1)[0]
        assert f"needs {'; '.join(n.text for n in rule.needs)}\n" in section, rule.id


class _Probe(Rule):
    """probe: a rule made of its declaration only."""

    id = "probe"
    title = "Probe"
    severity = Severity.LOW
    needs = (TRACE, need_run_steps("loss"))


def test_needs_gate_in_order_and_read_in_the_docs():
    probe = _Probe()
    run = ex.run(ex.series(3, loss=1.0))
    assert probe.skip_reason(BARE) == "needs a trace"
    assert probe.skip_reason(ex.inputs(trace=ex.trace(), run=ex.run())) == (
        "needs run step records with loss"
    )
    assert probe.skip_reason(ex.inputs(trace=ex.trace(), run=run)) is None
    assert rule_doc(probe).needs == ("a trace", "run step records with loss")
    assert "· needs a trace; run step records with loss\n" in render_markdown([probe])


def test_run_step_columns_need_a_value_not_just_the_column():
    need = need_run_steps("data_wait_ms", "step_time_ms")
    empty = ex.inputs(run=ex.run(ex.series(3, step_time_ms=10.0)))  # data_wait_ms all null
    full = ex.inputs(run=ex.run(ex.series(3, step_time_ms=10.0, data_wait_ms=1.0)))
    assert need.reason(empty) == "needs run step records with data_wait_ms and step_time_ms"
    assert need.reason(full) is None and need.reason(BARE) is not None


@pytest.mark.parametrize(
    ("inputs", "reason"),
    [
        (BARE, "no trace and no run records to read"),
        (CPU_RUN, "the run trained on CPU: judging X needs a CUDA device"),
        (CPU_TRACE, "the trace has no GPU activity: judging X needs a CUDA trace"),
        (CUDA_RUN, None),
        (CUDA_TRACE, None),
    ],
)
def test_cuda_need_says_what_the_inputs_hold_instead(inputs: AnalysisInputs, reason):
    assert need_cuda("judging X").reason(inputs) == reason


def test_cuda_trace_need_is_not_met_by_a_cuda_run():
    need = need_cuda_trace("only a profile shows it")
    for inputs in (BARE, CPU_TRACE, CUDA_RUN):
        assert need.reason(inputs) == "needs a CUDA trace: only a profile shows it"
    assert need.reason(CUDA_TRACE) is None
    assert need_cuda_trace().reason(CUDA_RUN) == "needs a CUDA trace"


def test_any_of_is_met_by_either_and_words_both_when_neither():
    need = need_any(TRACE, need_run_steps("loss"))
    assert need.text == "a trace or run step records with loss"
    assert need.reason(BARE) == "needs a trace or run step records with loss"
    assert need.reason(CPU_TRACE) is None
    assert need.reason(ex.inputs(run=ex.run(ex.series(3, loss=2.0)))) is None
    worded = need_any(TRACE, text="something", skip="nothing to read")
    assert (worded.text, worded.reason(BARE)) == ("something", "nothing to read")


def test_a_rule_with_its_needs_met_can_still_be_not_applicable():
    # epoch and data_wait_ms are there, but persistent workers live across epochs
    steps = ex.series(20, epoch=lambda s: 1 if s <= 10 else 2, data_wait_ms=1.0)
    config = {"data": {"num_workers": 2, "persistent_workers": True}}
    inputs = ex.inputs(run=ex.run(steps, config=config))
    rule = WorkerRestarts()
    assert all(need.met(inputs) for need in rule.needs)
    assert rule.skip_reason(inputs) == "persistent_workers is on: workers live across epochs"
    fresh = ex.inputs(run=ex.run(steps, config={"data": {"num_workers": 2}}))
    assert rule.skip_reason(fresh) is None


def test_typed_inputs_have_no_side_channel():
    with pytest.raises(TypeError):
        ex.inputs(vocab_usage={"vocab_size": 10, "used_token_ids": 1})  # type: ignore[call-arg]
    assert not hasattr(AnalysisInputs(), "extra")
