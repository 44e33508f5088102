"""The rank pool's workers draw on one budget for the whole input, and share an
address-space limit instead of each getting it whole."""

from __future__ import annotations

import gzip
import multiprocessing

import pytest

from diagnostics.analyze import analyze
from diagnostics.errors import InputError
from diagnostics.rank_pool import MIN_WORKER_ADDRESS_SPACE, digest_files, pool_plan
from diagnostics.trace.budget import Limits, SharedTotals
from tests.diagnostics.trace.helpers import SHARED_TRACES

# a real HTA rank (69k events, 14.7 MiB of JSON): the cheapest real one to read four times
RANK = SHARED_TRACES / "hta_v100_ns_timestamps.pt.trace.json.gz"
MIB = 1 << 20
GIB = 1 << 30


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ranks")
    for rank in range(4):
        (folder / f"rank{rank}.json.gz").symlink_to(RANK)
    with gzip.open(RANK, "rb") as inflated:
        json_bytes = sum(len(b) for b in iter(lambda: inflated.read(MIB), b""))
    return folder, json_bytes


def test_rank_files_each_under_the_byte_limit_are_refused_together_as_soon_as_crossed(
    four_ranks,
):
    folder, json_bytes = four_ranks
    limit = 40 * MIB
    assert json_bytes < limit < 4 * json_bytes  # each file fits, the four do not
    files = sorted(folder.iterdir())
    totals = SharedTotals(multiprocessing.get_context("spawn"))
    with pytest.raises(InputError) as caught:
        digest_files(files, [f.name for f in files], Limits(limit), totals=totals)
    message = str(caught.value)
    assert "decompresses to more than 40.0 MiB of JSON (all files of the input together)" in (
        message
    )
    assert "\n" not in message
    # refused when the total crossed the limit, not after every file was decoded: what the
    # workers read stops within a few 1 MiB blocks each of the limit (before: all 4 files)
    assert limit < totals.bytes_read < limit + 8 * MIB < 4 * json_bytes


def test_rank_files_each_under_the_event_limit_are_refused_together(four_ranks):
    folder, _ = four_ranks
    events_per_file = 68_692  # events and flows, as the budget counts them
    files = sorted(folder.iterdir())
    totals = SharedTotals(multiprocessing.get_context("spawn"))
    with pytest.raises(InputError, match=r"holds more than 80,000 events \(all files"):
        digest_files(files, [f.name for f in files], Limits(max_events=80_000), totals=totals)
    # before: every file decoded (274,768), then the sum refused
    assert 80_000 < totals.events_read < 3 * events_per_file < 4 * events_per_file


def test_a_folder_of_ranks_through_the_pool_is_refused_with_one_line(four_ranks):
    folder, _ = four_ranks
    with pytest.raises(InputError) as caught:
        analyze(folder, max_decompressed_bytes=40 * MIB)
    assert "(all files of the input together), the limit (raise --max-decompressed-mb" in str(
        caught.value
    )


def test_workers_share_an_address_space_limit_instead_of_each_getting_it():
    # no limit: as many workers as asked, none limited
    assert pool_plan(8, None, GIB) == (8, None)
    # 8 GiB, of which the starting process maps 0.5: at most 3 workers of >= 2 GiB each,
    # and all of them together within what is left (before: 8 workers x 8 GiB)
    workers, each = pool_plan(8, 8 * GIB, GIB // 2)
    assert workers == 3 and each >= MIN_WORKER_ADDRESS_SPACE
    assert workers * each + GIB // 2 <= 8 * GIB
    # too little for two: one worker with all that is left
    assert pool_plan(4, 3 * GIB, GIB) == (1, 2 * GIB)
    # nothing left: still one worker, which will fail on its first allocation (a memory error)
    assert pool_plan(4, GIB, 2 * GIB)[0] == 1
