"""Upload trace: one torch.profiler trace, or one per rank, diagnosed like a run.

Uploads are analysed from a private temporary folder that is removed straight after; they
are kept only when the user presses "Save upload" (into <runs dir>/uploads/). The analysis
runs in a child process with a memory and time limit (diagnostics.isolated): a bomb ends
that child with one line here, never the server. Files that disagree (GPU model, PyTorch
version, job) are not merged as ranks until the user says so.
"""

from __future__ import annotations

import streamlit as st

from app_ui import drilldown, render, session
from app_ui import uploads as uploads_ui
from app_ui.safe_text import md_code, md_text
from diagnostics import views
from diagnostics.errors import InputError
from diagnostics.isolated import analyze_upload_isolated
from diagnostics.views.upload_set import (
    ACCEPTED_EXTENSIONS,
    analyse_upload_set,
    release,
    shown_files,
)

session.setup_page("Upload trace", ":material/upload_file:")
st.title(":material/upload_file: Upload a trace")
max_upload_mb = int(st.get_option("server.maxUploadSize"))
st.markdown(
    "Drop a Chrome trace written by `torch.profiler` (`tensorboard_trace_handler` or "
    "`export_chrome_trace`) — or several, one per rank of a distributed job — or a CUDA "
    "memory snapshot (`torch.cuda.memory._dump_snapshot`; two of one job are compared)."
)
st.caption(
    f"`.json` or `.json.gz`, or a `.zip`/`.tar.gz` of them; snapshots `.pickle` or "
    "`.pickle.gz`, read without running anything in them · up to "
    f"{views.MAX_UPLOAD_FILES} files · "
    f"up to **{max_upload_mb} MB per file** as uploaded · {views.upload_limits_text()} · "
    "analysed from a temporary copy that is deleted straight after, unless you save it."
)

# no type filter here: the analyser names a wrong file and says which extensions it takes
uploads = st.file_uploader(
    "Trace files",
    accept_multiple_files=True,
    help=f"{' or '.join(ACCEPTED_EXTENSIONS)}, or an archive of them. Several files are read "
    "as the ranks of one job.",
)
if not uploads:
    if st.session_state["upload_analysis"] is not None:  # its step folder goes with it
        release(st.session_state["upload_analysis"][1])
    st.session_state["upload_analysis"] = None
    st.session_state["saved_upload_dir"] = None
    st.info(
        "Waiting for a trace. Nothing is kept until you choose to save it.",
        icon=":material/hourglass_top:",
    )
    st.stop()

files = [(upload.name, upload) for upload in uploads]
key = "|".join(sorted(upload.file_id for upload in uploads))
answer = st.session_state["upload_mode"]
mode = answer[1] if answer and answer[0] == key else None
cached = st.session_state["upload_analysis"]
if cached is None or cached[0] != (key, mode):
    if cached is not None:  # replaced: its step folder goes with it
        release(cached[1])
    with st.spinner(f"Analysing {len(files)} trace file{'s' if len(files) > 1 else ''}…"):
        bar = render.ProgressBar()  # the MB read, then each fact; many files: each rank file
        try:
            cached = (
                (key, mode),
                analyse_upload_set(files, analyze_upload_isolated, mode, progress=bar),
                None,
            )
        except InputError as exc:
            cached = ((key, mode), None, str(exc))
        bar.clear()
    st.session_state["upload_analysis"] = cached
    st.session_state["saved_upload_dir"] = None
_, upload_set, error = cached

if error is not None:  # names the user's file: text, not markdown
    st.error(md_text(error), icon=":material/error:")
    st.stop()

if upload_set.needs_answer:
    uploads_ui.ask_ranks_or_separate(upload_set, key)
    st.stop()
chosen = uploads_ui.chosen_result(upload_set)
result = chosen.result

names = shown_files(upload_set, chosen, [name for name, _ in files])
info, save = st.columns([4, 1])
info.markdown(
    f"**{md_text(names)}** · {md_text(views.source_caption(result.source, result.environment))}"
)
saved_to = st.session_state["saved_upload_dir"]
if saved_to:
    save.success(f"Saved to {md_code(saved_to)}", icon=":material/save:")
elif save.button(
    "Save upload", icon=":material/save:", help="Keep these files under the runs folder."
):
    st.session_state["saved_upload_dir"] = str(views.save_uploads(files, session.runs_dir()))
    st.rerun()

uploads_ui.rank_tables(upload_set, chosen)
if result.snapshot is None:
    render.cards(result)
render.memory_snapshot(result, key_prefix="upload")
st.subheader("Findings")
render.findings(result, key_prefix="upload")
if result.snapshot is None:
    st.subheader("Charts")
    render.run_charts(result, key_prefix="upload")
render.notes(result)
if result.snapshot is None:
    st.subheader("Drill down")
    drilldown.drilldown(chosen.drilldowns, key_prefix="upload")
st.subheader("Report")
render.downloads(
    lambda fmt: render.report_text(result, fmt), base_name="trace-report", key_prefix="upload"
)
