"""AppTest: the drill-down tabs on Upload and Run detail, and the mismatched-upload question.

Real traces only: a V100 trace and an H200 trace of this project's trainer uploaded together
must not be merged as ranks without asking; the tabs must render from the analyser's tables.
"""

from __future__ import annotations

import pytest

from app_ui.safe_text import shown
from tests.app.test_pages import open_page, texts

H200_RUN = "h200-sized/m768l6b256"
TABS = ["Overview", "Operators", "Kernels", "Memory", "Timeline", "Export"]


@pytest.fixture
def h200_trace(repo_root):
    run = repo_root.parent / "shared" / "gpu-runs" / H200_RUN
    return next((run / "trace").glob("*.json.gz"))


@pytest.fixture
def empty_env(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", str(tmp_path / "runs"))
    return tmp_path / "runs"


def upload(at, *paths):
    at.file_uploader[0].set_value([(p.name, p.read_bytes(), "application/gzip") for p in paths])
    return at.run()


def test_an_unsupported_extension_says_which_file_and_what_is_accepted(empty_env):
    at = open_page("pages/4_Upload_trace.py")
    at.file_uploader[0].set_value(("notes.txt", b"hello", "text/plain"))
    at.run()
    assert not at.exception
    # errors name the user's file, so they are escaped text (app_ui.safe_text): compare
    # what a person reads
    assert [shown(e.value) for e in at.error] == [
        "notes.txt: unsupported file type (.txt): upload Chrome traces written by "
        "torch.profiler, as .json or .json.gz, or a .zip/.tar/.tar.gz/.tgz of them, or CUDA "
        "memory snapshots (.pickle or .pickle.gz)"
    ]


@pytest.mark.slow
def test_a_v100_and_an_h200_trace_are_not_merged_without_asking(
    empty_env, shared_traces_dir, h200_trace
):
    v100 = shared_traces_dir / "kineto_resnet50_num_workers_0.pt.trace.json.gz"
    at = upload(open_page("pages/4_Upload_trace.py"), v100, h200_trace)
    assert not at.exception
    page = texts(at)
    assert "may not be ranks of one job" in page
    assert "GPU models differ" in page and "Tesla V100-DGXS-32GB" in page and "NVIDIA H200" in page
    assert not at.metric  # nothing analysed yet: no "2 ranks", no straggler finding
    labels = [b.label for b in at.button]
    assert "Analyse as ranks of one job" in labels and "Analyse each file separately" in labels

    next(b for b in at.button if b.label == "Analyse each file separately").click().run()
    assert not at.exception
    choice = at.selectbox(key="upload-separate-choice")
    assert choice.options == [v100.name, h200_trace.name]
    assert "rank-stragglers" not in texts(at)
    assert [t.label for t in at.tabs][-6:] == TABS
    # the header names the file shown, not both
    headers = [shown(m.value) for m in at.markdown]
    headers = [h for h in headers if v100.name in h or h200_trace.name in h]
    assert len(headers) == 1 and h200_trace.name not in headers[0], headers
    choice.set_value(h200_trace.name).run()
    assert not at.exception
    assert "NVIDIA H200" in texts(at)
    headers = [shown(m.value) for m in at.markdown]
    headers = [h for h in headers if v100.name in h or h200_trace.name in h]
    assert len(headers) == 1 and v100.name not in headers[0], headers


@pytest.mark.slow
def test_upload_as_ranks_shows_the_per_rank_table(empty_env, shared_traces_dir, h200_trace):
    v100 = shared_traces_dir / "kineto_resnet50_num_workers_0.pt.trace.json.gz"
    at = upload(open_page("pages/4_Upload_trace.py"), v100, h200_trace)
    next(b for b in at.button if b.label == "Analyse as ranks of one job").click().run()
    assert not at.exception
    assert "Ranks" in [s.value for s in at.subheader]
    identities = at.dataframe[0].value
    assert list(identities["file"]) == [v100.name, h200_trace.name]
    assert list(identities.columns) == [
        "file",
        "rank",
        "world size",
        "GPU",
        "PyTorch",
        "job",
        "host",
        "recorded (UTC)",
        "recording span (ms)",
        "events",
    ]
    # the per-rank table reads as people's words with units, not facts.ranks' columns
    per_rank = at.dataframe[1].value
    assert list(per_rank.columns)[:6] == [
        "rank",
        "profiled steps",
        "step time, mean (ms)",
        "step time, median (ms)",
        "step time, max (ms)",
        "GPU busy (kernels, copies, memsets) (%)",
    ]
    assert not any("_" in column for column in per_rank.columns)
    assert len(per_rank) == 2
    assert at.metric  # analysed


@pytest.mark.slow
def test_upload_drill_down_tabs_render_on_a_real_h200_trace(empty_env, h200_trace):
    at = upload(open_page("pages/4_Upload_trace.py"), h200_trace)
    assert not at.exception
    assert [t.label for t in at.tabs][-6:] == TABS
    assert "Drill down" in [s.value for s in at.subheader]
    # the operators table searches, and groups by shapes (this trainer records them)
    at.text_input(key="upload-op-search").set_value("aten::mm").run()
    assert not at.exception
    at.radio(key="upload-op-group").set_value("operator + input shapes").run()
    assert not at.exception
    table = next(df.value for df in at.dataframe if "input_shapes" in df.value.columns)
    assert set(table["operator"]) == {"aten::mm"}
    assert (table["input_shapes"].str.len() > 2).all()
    # timeline step choice: the steps of the trace
    step = at.selectbox(key="upload-timeline-step")
    assert len(step.options) >= 2
    step.select_index(0).run()
    assert not at.exception
    assert "CUDA runtime calls" in " ".join(c.value for c in at.tabs[-2].caption)


@pytest.mark.slow
def test_run_detail_has_the_drill_down_tabs(monkeypatch, trained_runs):
    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", str(trained_runs.runs_dir))
    at = open_page("pages/3_Run_detail.py", {"run": trained_runs.slow.name})
    assert not at.exception
    assert [t.label for t in at.tabs][-6:] == TABS
    kernels_or_ops = [df.value for df in at.dataframe if "operator" in df.value.columns]
    assert kernels_or_ops and len(kernels_or_ops[0]) > 0  # a CPU run still has operators
    # the Kernels tab explains itself instead of an empty table
    assert [i.value for i in at.tabs[-4].info] == ["No GPU kernels in this trace (a CPU run)."]
    assert not [df for df in at.dataframe if "kernel" in df.value.columns]
    # and the Timeline's legend does not promise GPU lanes a CPU run has not got
    legend = " ".join(c.value for c in at.tabs[-2].caption)
    assert "a CPU run: host threads only" in legend and "CUDA" not in legend


@pytest.mark.slow
def test_findings_on_an_uploaded_trace_give_code_for_the_users_script(empty_env, repo_root):
    run = repo_root.parent / "shared" / "gpu-runs" / "h200-default" / "gpu-slow-loader"
    trace = next((run / "trace").glob("*.json.gz"))
    at = upload(open_page("pages/4_Upload_trace.py"), trace)
    assert not at.exception
    codes = [c.value for c in at.code]
    assert any("DataLoader(" in code for code in codes)  # the fix, for the user's loader
    page = "\n".join([texts(at), *codes])
    assert "Config patch for the reference trainer" not in page
    assert "python -m trainer" not in page and "--set " not in page


def test_upload_tables_show_one_decimal_and_a_dash_for_missing_cells():
    """The per-rank and file tables of an upload showed 'None' cells and 245.8454 ms."""
    import polars as pl

    from app_ui.uploads import table_shown

    frame = pl.DataFrame(
        {"rank": [0, None], "step time, mean (ms)": [245.8454, None], "job": ["a", None]}
    )
    html = table_shown(frame).to_html()
    assert "245.8" in html and "245.8454" not in html
    assert "None" not in html and "nan" not in html.lower()
    assert html.count("—") == 3  # one per missing cell
    assert ">0<" in html and "0.0" not in html  # a rank stays a whole number
