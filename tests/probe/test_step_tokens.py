"""Tokens per step and their padded length, from padded dict batches through a real Session.

In-process, with the probe's hooks on a real DataLoader whose collate pads each batch to its
longest sequence, as HF's collators do. The steps are delimited the way the HF Trainer's
callback delimits them (explicit steps, an update's micro-batches fetched before it
begins). The expected figures are worked out by hand in the comments from the sequence
lengths below, not by the code under test."""

from __future__ import annotations

import json

import pytest
import torch

from diagnostics.runs import RunFolder, RunWriter
from probe.hooks import Hooks
from probe.profiler import ProfilerWindow
from probe.session import Session
from probe.step_values import batch_tokens

# real lengths, two to a micro-batch, two micro-batches to a step
LENGTHS = [3, 5, 2, 7, 4, 4, 6, 1]
PAD_ID = 0


def _pad(sequences: list[list[int]]) -> dict[str, torch.Tensor]:
    longest = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), longest), PAD_ID)
    mask = torch.zeros((len(sequences), longest), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = torch.tensor(sequence)
        mask[row, : len(sequence)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def test_a_steps_tokens_are_its_real_tokens_and_seq_len_their_weighted_padded_length(tmp_path):
    writer = RunWriter.create(tmp_path, {"scenario": None}, {}, run_id="run")
    session = Session(writer.path, window=ProfilerWindow(enabled=False), sample_hz=0)
    hooks = Hooks(session, {}, None)
    corpus = [list(range(1, n + 1)) for n in LENGTHS]
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(10, 4)
    optimizer = torch.optim.SGD(embedding.parameters(), lr=0.1)
    session.start()
    hooks.install()
    try:
        loader = torch.utils.data.DataLoader(corpus, batch_size=2, collate_fn=_pad)
        batches = iter(loader)
        session.expect_explicit_steps()  # what the HF callback's on_train_begin does
        for _ in range(2):
            micro_batches = [next(batches), next(batches)]  # fetched before the step begins
            session.explicit_begin()
            for batch in micro_batches:
                embedding(batch["input_ids"]).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            session.explicit_end()
    finally:
        hooks.uninstall()
        session.close()
    session.records.write_status("completed", None, session.steps_done)
    records = [json.loads(line) for line in (writer.path / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    # step 1: [3, 5] padded to 5 (8 real tokens), [2, 7] padded to 7 (9 real tokens):
    # 17 tokens, seq_len (8·5 + 9·7) / 17 = 103 / 17
    # step 2: [4, 4] padded to 4 (8), [6, 1] padded to 6 (7): 15 tokens, (8·4 + 7·6) / 15
    assert records[0]["tokens"] == 17 and records[0]["seq_len"] == pytest.approx(103 / 17)
    assert records[1]["tokens"] == 15 and records[1]["seq_len"] == pytest.approx(74 / 15)
    assert [r["batch_size"] for r in records] == [4, 4]
    # the run folder's reader types them (Int64, Float64) like every step field
    steps = RunFolder(writer.path).steps()
    assert steps["tokens"].to_list() == [17, 15]
    assert steps["seq_len"].to_list() == pytest.approx([103 / 17, 74 / 15])


def test_only_a_mapping_with_input_ids_has_tokens_and_without_a_mask_every_id_counts():
    ids = torch.ones((3, 8), dtype=torch.long)
    assert batch_tokens({"input_ids": ids}) == (24, 8)  # no mask: 3 x 8 ids
    half = torch.cat([torch.ones(3, 4), torch.zeros(3, 4)], dim=1)
    assert batch_tokens({"input_ids": ids, "attention_mask": half}) == (12, 8)
    # a mask of another shape (a 4-D attention bias) is not a padding mask: every id
    assert batch_tokens({"input_ids": ids, "attention_mask": half[None, None]}) == (24, 8)
    # 3-D ids (multiple choice: batch x choices x length): every id, the last dimension
    assert batch_tokens({"input_ids": torch.ones((2, 4, 5), dtype=torch.long)}) == (40, 5)
    for batch in (ids, (ids, ids), [ids], {"pixel_values": ids}, {"input_ids": [1, 2]}):
        assert batch_tokens(batch) is None
    assert batch_tokens({"input_ids": torch.tensor(3)}) is None  # a 0-d tensor has no length


class _Unreadable(dict):
    def get(self, key, default=None):
        raise KeyError(key)


def test_a_mapping_that_fails_to_read_has_no_tokens_and_raises_nothing():
    assert batch_tokens(_Unreadable(input_ids=torch.ones(2, 2))) is None


def test_both_record_paths_carry_tokens_and_seq_len_in_one_order():
    from probe.step_values import HOST_FIELDS, host_step_record, step_record

    row = (3, "train", 100.0, 4, 1 << 20, False, None, 1.0, 1.5, 0.1, 17, 103 / 17, 0.2)
    cpu = host_step_record(row, 0.5, 2.0, None)
    # the CUDA path: the host's figures completed by step_record
    cuda = step_record(dict(zip(HOST_FIELDS, row, strict=True)), {}, host_clock=False)
    assert list(cpu) == list(cuda)
    for record in (cpu, cuda):
        assert (record["tokens"], record["seq_len"]) == (17, 103 / 17)
    # on a host clock the two build the same record, value for value: the compute is what
    # the step leaves after its data wait and optimizer (1.5 - 1.0 - 0.1 ms)
    on_host = step_record(
        dict(zip(HOST_FIELDS, row, strict=True)), {"loss": 0.5, "grad_norm": 2.0}, host_clock=True
    )
    assert cpu == on_host
    assert cpu["compute_ms"] == pytest.approx(0.4)
