"""Upload trace: one torch.profiler trace, or one per rank, diagnosed like a run.

Uploads are analysed from a private temporary folder that is removed straight after; they
are kept only when the user presses "Save upload" (into <runs dir>/uploads/).
"""

from __future__ import annotations

import streamlit as st

from app_ui import render, session
from diagnostics import views
from diagnostics.analyze import DEFAULT_MAX_DECOMPRESSED_BYTES, analyze_files
from diagnostics.errors import InputError

session.setup_page("Upload trace", ":material/upload_file:")
st.title(":material/upload_file: Upload a trace")
max_upload_mb = int(st.get_option("server.maxUploadSize"))
st.markdown(
    "Drop a Chrome trace written by `torch.profiler` (`tensorboard_trace_handler` or "
    "`export_chrome_trace`) — or several, one per rank of a distributed job."
)
st.caption(
    f"`.json` or `.json.gz`, or a `.zip`/`.tar.gz` of them · up to "
    f"{views.MAX_UPLOAD_FILES} files · "
    f"up to **{max_upload_mb} MB per file** as uploaded and "
    f"**{views.fmt_bytes(DEFAULT_MAX_DECOMPRESSED_BYTES)}** once decompressed · analysed from "
    "a temporary copy that is deleted straight after, unless you save it."
)

uploads = st.file_uploader(
    "Trace files",
    type=["json", "gz", "zip", "tgz", "tar"],
    accept_multiple_files=True,
    help="Several files are read as the ranks of one job.",
)
if not uploads:
    st.session_state["upload_analysis"] = None
    st.session_state["saved_upload_dir"] = None
    st.info(
        "Waiting for a trace. Nothing is kept until you choose to save it.",
        icon=":material/hourglass_top:",
    )
    st.stop()

files = [(upload.name, upload) for upload in uploads]
key = "|".join(sorted(upload.file_id for upload in uploads))
cached = st.session_state["upload_analysis"]
if cached is None or cached[0] != key:
    with st.spinner(f"Analysing {len(files)} trace file{'s' if len(files) > 1 else ''}…"):
        try:
            cached = (key, views.analyse_uploads(files, analyze_files), None)
        except InputError as exc:
            cached = (key, None, str(exc))
    st.session_state["upload_analysis"] = cached
    st.session_state["saved_upload_dir"] = None
_, result, error = cached

if error is not None:
    st.error(error, icon=":material/error:")
    st.stop()

names = ", ".join(name for name, _ in files)
info, save = st.columns([4, 1])
info.markdown(f"**{names}** · {views.source_caption(result.source, result.environment)}")
saved_to = st.session_state["saved_upload_dir"]
if saved_to:
    save.success(f"Saved to `{saved_to}`", icon=":material/save:")
elif save.button(
    "Save upload", icon=":material/save:", help="Keep these files under the runs folder."
):
    st.session_state["saved_upload_dir"] = str(views.save_uploads(files, session.runs_dir()))
    st.rerun()

render.cards(result)
st.subheader("Findings")
render.findings(result, key_prefix="upload")
st.subheader("Charts")
render.run_charts(result, key_prefix="upload")
render.notes(result)
st.subheader("Report")
render.downloads(
    lambda fmt: render.report_text(result, fmt), base_name="trace-report", key_prefix="upload"
)
