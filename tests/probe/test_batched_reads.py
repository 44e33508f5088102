"""Per-step costs cut for tiny steps: CPU figures read in batches, step lines buffered.

The expected figures are computed here by hand (sqrt of sums of squares, plain floats),
not by the code under test."""

from __future__ import annotations

import json
import math

import torch

from diagnostics.runs import RankRecords, rank_file
from probe.deferred import HostScalars, PendingSteps
from probe.step_values import NormParts, gradient_norm


def test_host_scalars_read_a_batch_of_losses_norms_and_scales_as_the_steps_gave_them():
    scalars = HostScalars(every=3)
    grads = [torch.tensor([3.0, 4.0]), torch.tensor([[12.0]])]  # |g| = sqrt(9+16+144) = 13
    first = scalars.add(torch.tensor(0.5), gradient_norm(grads), None)
    second = scalars.add(torch.tensor([2.0], dtype=torch.float64), 7.0, 1024.0)
    assert not first.ready()  # nothing read before the batch is full: no per-step read
    third = scalars.add(None, NormParts([torch.tensor(1.0), torch.tensor(1.0)]), None)
    assert first.ready() and third.ready()
    assert first.get() == {"loss": 0.5, "grad_norm": 13.0, "amp_scale": None}
    assert second.get() == {"loss": 2.0, "grad_norm": 7.0, "amp_scale": 1024.0}
    assert third.get()["loss"] is None
    assert math.isclose(third.get()["grad_norm"], math.sqrt(2), rel_tol=1e-6)


def test_norm_parts_of_different_widths_are_reduced_row_by_row():
    scalars = HostScalars(every=2)
    one = scalars.add(None, NormParts([torch.tensor(5.0)]), None)
    two = scalars.add(None, NormParts([torch.tensor(6.0), torch.tensor(8.0)]), None)
    assert (one.get()["grad_norm"], two.get()["grad_norm"]) == (5.0, 10.0)


def test_a_flush_reads_the_rows_of_a_batch_not_yet_full():
    written = []
    scalars = HostScalars(every=10)
    pending = PendingSteps(written.append, lambda record, times, values: values, scalars)

    class Now:
        def ready(self):
            return True

        def wait(self):
            pass

        def get(self):
            return {}

    for loss in (1.0, 2.0):
        pending.push({}, Now(), scalars.add(torch.tensor(loss), None, None))
    assert written == []  # the batch is not full yet
    assert pending.flush() == 2
    assert [row["loss"] for row in written] == [1.0, 2.0]


def test_step_lines_are_buffered_and_all_reach_the_file_on_close(tmp_path):
    records = RankRecords(tmp_path, 0)
    path = tmp_path / rank_file("steps.jsonl", 0)
    for step in range(1, 6):
        records.append_step({"step": step})
    assert path.read_text() == ""  # within the flush interval: nothing written yet
    records.write_status("completed", None, 5)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5]


def test_a_stale_buffer_is_written_by_the_sampler_tick(tmp_path):
    records = RankRecords(tmp_path, 0)
    path = tmp_path / rank_file("steps.jsonl", 0)
    records.append_step({"step": 1})
    records.flush_if_stale()
    assert path.read_text() == ""
    records._steps._last_flush -= 10.0  # as if the last write was 10 s ago
    records.flush_if_stale()
    assert json.loads(path.read_text()) == {"step": 1}
