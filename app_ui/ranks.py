"""Run detail's per-rank section for a distributed run: the table with its stragglers marked
(a word in a column and a tinted row, never colour alone) and step time per rank."""

from __future__ import annotations

import streamlit as st

from app_ui import render
from diagnostics.views.ranks import (
    STRAGGLER_MARK,
    RankView,
    rank_steps_figure,
    rank_table_text,
)

# st.table shows every cell as text a reader (and a browser test) can find; past this many
# ranks the scrolling grid keeps the page short
TABLE_MAX_RANKS = 16
STRAGGLER_TINT = "background-color: rgba(255, 75, 75, 0.18); font-weight: 600"


def rank_section(view: RankView, key_prefix: str) -> None:
    st.subheader("Ranks")
    if view.straggler_ranks:
        names = ", ".join(str(r) for r in view.straggler_ranks)
        plural = "s" if len(view.straggler_ranks) > 1 else ""
        st.warning(
            f"Straggler rank{plural}: **{names}** (the rank-stragglers finding below says why).",
            icon=":material/directions_walk:",
        )
    st.caption(
        f"{view.world_size} processes; the cards above read rank 0's step records. Step "
        "time and data wait: median of each rank's own "
        "step records (first step of each phase left out). Compute, exposed communication "
        "and waiting in collectives: per profiled step, from each rank's trace"
        + ("." if view.has_trace_table else " (no per-rank trace table in this analysis: —).")
    )
    labelled = rank_table_text(view).to_pandas()
    mark_column = labelled.columns[-1]
    styled = labelled.style.apply(
        lambda row: [STRAGGLER_TINT if row[mark_column] == STRAGGLER_MARK else ""] * len(row),
        axis=1,
    ).format(precision=1, na_rep="—")
    if view.world_size <= TABLE_MAX_RANKS:
        st.table(styled.hide(axis="index"))
    else:
        st.dataframe(styled, hide_index=True, width="stretch")
    render.chart(rank_steps_figure(view), key=f"{key_prefix}-rank-steps")
