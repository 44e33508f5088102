"""What the app's pages show, computed without streamlit or torch.

Pages stay thin: they call one function here (or in the analyser/launcher) and render what
comes back. Everything here is pure and typed so it is tested without a browser:

- ``fmt``       numbers for people (durations, sizes, shares, rates, times)
- ``analysis``  summary cards, evidence rows, severity badges, chart inputs from findings
- ``alert``     the too-long-run alert's state as one line
- ``runs``      status badges, filters, the runs table, live progress, the compare default
- ``config``    config tables, patches, re-run overrides, the launch form
- ``uploads``   safe names, the analyser's private temporary copy, saving an upload
- ``compare``   a comparison as cards and a table, and its ranks side by side
- ``ranks``     a distributed run's per-rank table and step time per rank

``from diagnostics import views`` gives every public name of these modules.
"""

from __future__ import annotations

from diagnostics.report.sections import is_script_patch
from diagnostics.views.alert import AlertView, alert_summary
from diagnostics.views.analysis import (
    SEVERITY_BADGES,
    Card,
    card_rows,
    coverage_rows,
    evidence_rows,
    leak_slope,
    operator_time_column,
    roofline_summary_rows,
    severity_badge,
    source_caption,
    spike_steps,
    summary_cards,
)
from diagnostics.views.compare import (
    CompareCard,
    comparison_card,
    comparison_table,
    config_changes_table,
    headline,
    rank_comparison_table,
)
from diagnostics.views.config import (
    LAUNCH_FORM,
    SIZE_FIELD,
    FormField,
    config_table,
    form_error_summary,
    form_overrides,
    form_value,
    patch_command,
    patch_rows,
    patch_summary,
    rerun_overrides,
    resolve_runs_dir,
    script_table,
    tensorboard_command,
)
from diagnostics.views.fmt import (
    fmt_bytes,
    fmt_ms,
    fmt_number,
    fmt_pct,
    fmt_rate,
    fmt_ratio,
    fmt_saving,
    fmt_seconds,
    fmt_step_time_saving,
    fmt_when,
    prediction_line,
)
from diagnostics.views.ranks import RankView, rank_steps_figure, rank_view
from diagnostics.views.runs import (
    NOT_ANALYSED,
    RUN_STATES,
    STATUS_BADGES,
    Progress,
    RunFigures,
    children_of,
    default_pair,
    filter_runs,
    find_run,
    findings_digest,
    findings_text,
    not_analysed,
    progress,
    run_choice_label,
    run_duration_s,
    run_figures,
    run_label,
    runs_table,
    safe_run_path,
    status_badge,
)
from diagnostics.views.uploads import (
    MAX_UPLOAD_FILES,
    analyse_uploads,
    is_trace_name,
    safe_upload_name,
    save_uploads,
    saved_upload_dir,
    upload_key,
    upload_limits_text,
    write_uploads,
)

__all__ = [
    "AlertView",
    "alert_summary",
    "Card",
    "coverage_rows",
    "roofline_summary_rows",
    "CompareCard",
    "FormField",
    "LAUNCH_FORM",
    "MAX_UPLOAD_FILES",
    "Progress",
    "RankView",
    "RUN_STATES",
    "SEVERITY_BADGES",
    "SIZE_FIELD",
    "STATUS_BADGES",
    "analyse_uploads",
    "upload_limits_text",
    "children_of",
    "comparison_card",
    "comparison_table",
    "config_changes_table",
    "config_table",
    "default_pair",
    "evidence_rows",
    "filter_runs",
    "find_run",
    "fmt_bytes",
    "fmt_ms",
    "fmt_number",
    "fmt_pct",
    "fmt_rate",
    "fmt_ratio",
    "fmt_saving",
    "fmt_step_time_saving",
    "fmt_seconds",
    "fmt_when",
    "prediction_line",
    "form_error_summary",
    "form_overrides",
    "form_value",
    "headline",
    "is_trace_name",
    "leak_slope",
    "operator_time_column",
    "patch_command",
    "patch_rows",
    "patch_summary",
    "progress",
    "rank_comparison_table",
    "rank_steps_figure",
    "rank_view",
    "rerun_overrides",
    "resolve_runs_dir",
    "run_choice_label",
    "run_label",
    "script_table",
    "is_script_patch",
    "run_duration_s",
    "runs_table",
    "NOT_ANALYSED",
    "RunFigures",
    "findings_digest",
    "findings_text",
    "not_analysed",
    "run_figures",
    "safe_run_path",
    "safe_upload_name",
    "save_uploads",
    "saved_upload_dir",
    "severity_badge",
    "source_caption",
    "spike_steps",
    "status_badge",
    "card_rows",
    "summary_cards",
    "tensorboard_command",
    "upload_key",
    "write_uploads",
]
