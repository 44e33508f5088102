"""A CPU script's step records, gathered as tuples and written in batches of ten steps.

In-process (no subprocess, no profiler window): the loop computes its own expectations
with plain floats -- the loss it got, the gradient norm by hand from ``p.grad.tolist()``
before the update, the clock around each step -- so nothing expected comes from the code
under test."""

from __future__ import annotations

import json
import math
import os
import time

import pytest
import torch

from diagnostics.runs import RunWriter
from probe.hooks import Hooks
from probe.integrations import Integrations
from probe.profiler import ProfilerWindow
from probe.session import Session
from tests.cpu_contention import one_core_beside_a_busy_rival, spin

WRITTEN_FIELDS = [  # a script step's record, as before the batching (docs/RUN-FOLDER.md)
    "step",
    "epoch",
    "phase",
    "wall_time",
    "step_time_ms",
    "data_wait_ms",
    "h2d_ms",
    "compute_ms",
    "optimizer_ms",
    "cpu_wait_ms",
    "loss",
    "grad_norm",
    "amp_scale",
    "batch_size",
    "samples_per_s",
    "tokens",  # null here: no batch with input_ids
    "seq_len",
    "rss_bytes",
    "profiled",
    "marks",
]


def _session(tmp_path):
    writer = RunWriter.create(tmp_path, {"scenario": None}, {}, run_id="run")
    session = Session(writer.path, window=ProfilerWindow(enabled=False), sample_hz=0)
    return writer.path, session, Hooks(session, {}, None)


def test_cpu_steps_keep_every_field_the_loss_and_norm_each_step_gave_and_their_clock(tmp_path):
    path, session, hooks = _session(tmp_path)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 3), torch.randn(4, 1)
    seen = []
    session.start()
    hooks.install()
    try:
        for _ in range(13):  # one batch of ten, then three left for close()
            began = time.time()
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            squares = sum(v * v for p in model.parameters() for v in _flat(p.grad.tolist()))
            optimizer.step()
            seen.append((float(loss.detach()), math.sqrt(squares), began, time.time()))
        lines_before_close = (path / "steps.jsonl").read_text().splitlines()
    finally:
        hooks.uninstall()
        session.close()
    session.records.write_status("completed", None, session.steps_done)
    records = [json.loads(line) for line in (path / "steps.jsonl").read_text().splitlines()]
    assert len(lines_before_close) in (0, 10)  # written whole batches only (or still buffered)
    assert [r["step"] for r in records] == list(range(1, 14))
    for record in records:
        assert list(record) == WRITTEN_FIELDS, record
    for record, (loss, norm, began, ended) in zip(records, seen, strict=True):
        assert record["loss"] == pytest.approx(loss, rel=1e-5)
        assert record["grad_norm"] == pytest.approx(norm, rel=1e-5)
        assert began - 0.01 <= record["wall_time"] <= ended + 0.01
        assert record["phase"] == "train" and record["rss_bytes"] > 0
        assert record["data_wait_ms"] is None and record["compute_ms"] is None  # no loader
        assert 0 < record["optimizer_ms"] <= record["step_time_ms"]
        assert 0 <= record["cpu_wait_ms"] <= record["step_time_ms"] + 1.0
    assert records[0]["marks"] == "epoch_start"
    assert all(r["marks"] is None for r in records[1:])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")
def test_a_scripts_step_records_the_time_another_process_had_the_cpu(tmp_path):
    """The training thread and a busy process on one core: about half of each step the
    thread waits for the CPU, and its record says so, as the trainer's do; the
    step-time-outliers rule then leaves steps slow only by that wait out (an HF Trainer
    run under CI's load was judged on such steps)."""
    path, session, hooks = _session(tmp_path)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 3), torch.randn(4, 1)
    session.start()
    hooks.install()
    try:
        with one_core_beside_a_busy_rival():
            for _ in range(4):
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                spin(0.2)  # wall time: the rival takes about half of it
                optimizer.step()
    finally:
        hooks.uninstall()
        session.close()
    records = [json.loads(line) for line in (path / "steps.jsonl").read_text().splitlines()]
    # the first step opens at the first backward(); the rest span a whole iteration
    assert len(records) == 4
    for record in records:
        assert 0.25 * record["step_time_ms"] <= record["cpu_wait_ms"], record
        assert record["cpu_wait_ms"] <= record["step_time_ms"] + 1.0, record


def test_a_session_after_one_that_patched_lmdb_in_the_same_process_records_no_store_fields(
    tmp_path,
):
    """The read counter is the process's: an earlier in-process session whose script had
    imported lmdb left it active, and a later session's steps carried store fields for reads
    they never made (found when xdist put this file after such a test)."""
    import lmdb  # noqa: F401  # imported before the earlier session, as an in-process caller does

    earlier = Integrations(lambda note: None)
    earlier.install()  # patches the already-imported lmdb: the counter turns active
    earlier.uninstall()
    path, session, hooks = _session(tmp_path)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session.start()
    hooks.install()
    try:
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            optimizer.step()
    finally:
        hooks.uninstall()
        session.close()
    session.records.write_status("completed", None, session.steps_done)
    records = [json.loads(line) for line in (path / "steps.jsonl").read_text().splitlines()]
    assert len(records) == 3
    for record in records:
        assert not [field for field in record if field.startswith("store_")], record


def test_steps_counted_before_the_device_is_known_are_written_first(tmp_path):
    """Batches counted before any backward() (no device yet) and the optimizer steps
    after it keep one order in the file."""
    path, session, _ = _session(tmp_path)
    session.start()
    for _ in range(3):  # an evaluation loop: each batch fetched ends the step before it
        now = time.perf_counter()
        session.fetch_started(now)
        session.fetch_ended(now, time.perf_counter(), torch.zeros(2, 1))
    session.close()
    session.records.write_status("completed", None, session.steps_done)
    records = [json.loads(line) for line in (path / "steps.jsonl").read_text().splitlines()]
    assert [(r["step"], r["phase"], r["batch_size"]) for r in records] == [
        (1, "batches", 2),
        (2, "batches", 2),
        (3, "batches", 2),
    ]
    assert all(r["loss"] is None and r["grad_norm"] is None for r in records)


def _flat(values):
    if isinstance(values, list):
        for value in values:
            yield from _flat(value)
    else:
        yield values
