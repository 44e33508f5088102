"""Real CUDA memory snapshots, recorded here with torch (no trainer involved) and read by
the restricted reader: the dump state against torch's own counters to the byte, a leak
named by its line, an out-of-memory snapshot's cause. Needs CUDA: skipped elsewhere.
(No GPU was lent to the session that wrote these, so they have not run yet.)"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from diagnostics.analyze import analyze_snapshots  # noqa: E402
from diagnostics.snapshot.writer import write_snapshot  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

LEAK_LINE = None  # set by _step: the line that keeps a tensor each step


def _step(model, optimizer, kept):
    global LEAK_LINE
    x = torch.randn(256, 1024, device="cuda")
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    import inspect

    LEAK_LINE = inspect.currentframe().f_lineno + 1
    kept.append(torch.empty(4 * 2**20, device="cuda", dtype=torch.uint8))  # 4 MiB a step


@pytest.fixture
def recording():
    torch.cuda.empty_cache()
    torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
    yield
    torch.cuda.memory._record_memory_history(enabled=None)


def test_a_leak_is_named_by_its_line(tmp_path, recording):
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU()).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    kept: list = []
    paths = []
    for step in range(8):
        _step(model, optimizer, kept)
        if step in (2, 7):
            torch.cuda.synchronize()
            snap = torch.cuda.memory._snapshot()
            path = write_snapshot(snap, tmp_path / f"step_{step}.pickle")
            paths.append(path)
            if step == 7:
                # the dump state to the byte against torch's own counters at that moment
                reserved, allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    result = analyze_snapshots(paths)
    dump = result.snapshot.dump
    assert dump.reserved_bytes == reserved
    assert dump.active_bytes == allocated
    leaks = [f for f in result.findings if f.rule == "memory-leak-by-site"]
    assert leaks, [f.rule for f in result.findings]
    assert leaks[0].evidence["site"].endswith(f"test_gpu_snapshots.py:{LEAK_LINE} in _step")
    assert leaks[0].evidence["growth_bytes"] == 5 * 4 * 2**20


def test_an_out_of_memory_snapshot_names_its_cause(tmp_path, recording):
    free, _ = torch.cuda.mem_get_info()
    held = []
    chunk = 1 << 30
    try:
        while True:
            held.append(torch.empty(chunk, device="cuda", dtype=torch.uint8))
    except torch.cuda.OutOfMemoryError:
        path = write_snapshot(torch.cuda.memory._snapshot(), tmp_path / "oom.pickle")
    finally:
        del held
        torch.cuda.empty_cache()
    result = analyze_snapshots([path])
    oom = result.snapshot.oom
    assert oom is not None and oom.requested_bytes == chunk
    (finding,) = [f for f in result.findings if f.rule == "out-of-memory-cause"]
    assert finding.evidence["cause"] == "held_by_site"
    assert "test_an_out_of_memory_snapshot_names_its_cause" in finding.evidence["sites"][0]["site"]
    assert oom.allocated_bytes >= free // 2
