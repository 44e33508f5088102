"""The Upload page's parts for several files: the "ranks or separately?" question, the
choice among separately analysed files, and the per-rank tables."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl
import streamlit as st

from app_ui.safe_text import md_text
from diagnostics.views.upload_set import (
    IDENTITY_LABELS,
    RANKS_LABELS,
    UploadResult,
    UploadSet,
    labelled,
)

if TYPE_CHECKING:
    from pandas.io.formats.style import Styler


def ask_ranks_or_separate(upload_set: UploadSet, key: str) -> None:
    """Why the files may not be one job, what each says, and the two answers (stored in
    the session for this upload ``key``; the page reruns with it)."""
    st.warning(
        "**These files may not be ranks of one job:**\n"
        + "\n".join(f"- {md_text(reason)}" for reason in upload_set.mismatches),
        icon=":material/help:",
    )
    _identities(upload_set)
    ranks, separate = st.columns(2)
    if ranks.button("Analyse as ranks of one job", icon=":material/join:", width="stretch"):
        st.session_state["upload_mode"] = (key, "ranks")
        st.rerun()
    if separate.button(
        "Analyse each file separately", icon=":material/call_split:", width="stretch"
    ):
        st.session_state["upload_mode"] = (key, "separate")
        st.rerun()


def chosen_result(upload_set: UploadSet) -> UploadResult:
    """The one result, or the file the user picks when each was analysed on its own."""
    if len(upload_set.results) == 1:
        return upload_set.results[0]
    labels = [r.label for r in upload_set.results]
    label = st.selectbox("Analysed separately: show", labels, key="upload-separate-choice")
    return upload_set.results[labels.index(label)]


def rank_tables(upload_set: UploadSet, chosen: UploadResult) -> None:
    """Several files analysed as ranks: what each file says, and the per-rank summary."""
    if upload_set.mode != "ranks" or upload_set.identities.height < 2:
        return
    st.subheader("Ranks")
    if upload_set.mismatches:
        st.caption(
            "Analysed as ranks of one job at your request, although: "
            + md_text("; ".join(upload_set.mismatches))
        )
    _identities(upload_set)
    facts = chosen.result.facts
    if facts is not None and facts.ranks is not None:
        st.dataframe(
            table_shown(labelled(facts.ranks, RANKS_LABELS)), hide_index=True, width="stretch"
        )


def _identities(upload_set: UploadSet) -> None:
    st.dataframe(
        table_shown(labelled(upload_set.identities, IDENTITY_LABELS)),
        hide_index=True,
        width="stretch",
    )


def table_shown(frame: pl.DataFrame) -> Styler:
    """Numbers to one decimal and missing cells as —, as Run detail's rank table shows them
    (raw, the grid showed 'None' and 245.8454); whole-number columns stay whole, also with
    a missing cell (pandas would make them floats)."""
    table = frame.to_pandas()
    for name, dtype in frame.schema.items():
        if dtype.is_integer():
            table[name] = table[name].astype("Int64")
    return table.style.format(precision=1, na_rep="—")
