"""A process that loads traces keeps the C-heap memory it frees, for the next chunk."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from diagnostics.errors import InputError
from diagnostics.trace import freed_memory, loader
from tests.diagnostics.trace.helpers import small_events, trace_doc

pytestmark = pytest.mark.skipif(
    freed_memory._mallopt is None, reason="the C library is not glibc (no mallopt)"
)

# A load's pattern: an inflate thread makes 1 MB blocks of text, the loading thread joins
# them into a chunk's text of 4 MB and drops them. Page faults per page of text read, in a
# fresh process (glibc's thresholds are the process's, and loads in this one set them).
CHUNKS_OF_TEXT = """
import os, queue, resource, sys, threading
from diagnostics.trace.freed_memory import keep_freed_memory

def read(blocks, size=1 << 20):
    handoff = queue.Queue(maxsize=2)
    def inflate():
        for _ in range(blocks):
            handoff.put(os.urandom(16) * (size // 16))
        handoff.put(None)
    thread = threading.Thread(target=inflate)
    thread.start()
    text = bytearray()
    while (block := handoff.get()) is not None:
        text = bytearray().join([text, block])
        if len(text) >= 4 << 20:
            text = text[-1000:]
    thread.join()

if sys.argv[1] == "kept":
    assert keep_freed_memory()
read(20)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
read(200)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / (200 * 256))
"""


def faults_per_page(mode: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", CHUNKS_OF_TEXT, mode],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return float(done.stdout)


def test_a_loads_buffers_reuse_the_same_pages():
    # glibc's starting thresholds: every page of text is faulted in again, more than once
    assert faults_per_page("default") > 0.5
    assert faults_per_page("kept") < 0.05


def test_a_load_keeps_freed_memory_while_it_decodes_and_gives_it_back_after(monkeypatch, tmp_path):
    calls: list[str] = []
    monkeypatch.setattr(loader, "keep_freed_memory", lambda: calls.append("keep"))
    monkeypatch.setattr(loader, "give_freed_memory_back", lambda: calls.append("give back"))
    real_decode = loader.decode_trace

    def decode(*args, **kwargs):
        calls.append("decode")
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(loader, "decode_trace", decode)
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace_doc(small_events())))
    assert loader.load_trace_file(path).events.height == 4
    assert calls == ["keep", "decode", "give back"]


def test_a_refused_load_gives_freed_memory_back_too(monkeypatch, tmp_path):
    calls: list[str] = []
    monkeypatch.setattr(loader, "keep_freed_memory", lambda: calls.append("keep"))
    monkeypatch.setattr(loader, "give_freed_memory_back", lambda: calls.append("give back"))
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace_doc([])))
    with pytest.raises(InputError, match="traceEvents is empty"):
        loader.load_trace_file(path)
    assert calls == ["keep", "give back"]
