"""After an AppTest, a process started with spawn in the same test process still starts.

Streamlit's AppTest leaves its temporary script in sys.modules["__main__"]; a spawned child
re-runs the parent's __main__ from its file, and that script dies outside AppTest's runner.
tests/conftest.py puts the real __main__ back after each test. The two tests run in this
order in one process (one file is one xdist unit)."""

from __future__ import annotations

import multiprocessing

from streamlit.testing.v1 import AppTest


def _page() -> None:
    import streamlit as st

    st.write("a page")


def _nothing() -> None:
    return None


def test_an_apptest_runs_a_page():
    at = AppTest.from_function(_page).run()
    assert not at.exception
    assert at.markdown[0].value == "a page"


def test_then_a_spawned_process_starts_and_exits_cleanly():
    process = multiprocessing.get_context("spawn").Process(target=_nothing)
    process.start()
    process.join(timeout=120)
    assert process.exitcode == 0
