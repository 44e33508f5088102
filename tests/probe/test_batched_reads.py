"""Per-step costs cut for tiny steps: step lines buffered.

The expected figures are computed here by hand (sqrt of sums of squares, plain floats),
not by the code under test."""

from __future__ import annotations

import json

from diagnostics.runs import RankRecords, rank_file


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


def test_a_batch_of_losses_norms_and_scales_is_read_as_the_steps_gave_them():
    import math

    import torch

    from probe.deferred import read_floats
    from probe.step_values import NormParts, gradient_norm

    grads = [torch.tensor([3.0, 4.0]), torch.tensor([[12.0]])]  # |g| = sqrt(9+16+144) = 13
    values = [
        torch.tensor(0.5),
        gradient_norm(grads),
        torch.tensor([2.0], dtype=torch.float64),
        7.0,
        None,
        NormParts([torch.tensor(5.0)]),
        NormParts([torch.tensor(6.0), torch.tensor(8.0)]),  # parts of different widths
    ]
    read = read_floats(values)
    assert read[0] == 0.5 and read[2:5] == [2.0, 7.0, None]
    assert math.isclose(read[1], 13.0, rel_tol=1e-6)
    assert (read[5], read[6]) == (5.0, 10.0)
