"""Hostile and odd input, round two (issue 23): archives bounded in the child, gzip and
Chrome-trace variants read right, and no false messages.

Every case is built at test time from the shared real traces (or crafted byte by byte), with
the verdict expected for it."""

from __future__ import annotations

import gzip
from pathlib import Path

from polars.testing import assert_frame_equal

from diagnostics.trace.loader import load_trace_file

QWEN_H100 = "tracelens_h100_qwen1.5-0.5b_infer_profmem.json.gz"


# -- gzip -------------------------------------------------------------------------------


def test_a_two_member_gzip_split_past_1_mib_loads_as_the_single_member_file(
    shared_traces_dir: Path, tmp_path: Path
) -> None:
    # `cat a.gz b.gz`: the JSON text cut mid-way (3 MiB in, inside an event) into two
    # members. Before: "is not valid JSON: trailing characters" (the second member's bytes
    # were inflated twice, as Python 3.11 keeps them in unconsumed_tail and unused_data).
    original = shared_traces_dir / QWEN_H100
    text = gzip.decompress(original.read_bytes())
    cut = 3 << 20
    assert len(text) > 2 * cut
    split = tmp_path / "two-members.json.gz"
    split.write_bytes(gzip.compress(text[:cut]) + gzip.compress(text[cut:]))
    single, joined = load_trace_file(original), load_trace_file(split)
    assert joined.events.height == single.events.height > 10_000
    assert_frame_equal(joined.events, single.events)
