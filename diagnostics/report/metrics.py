"""Moved to :mod:`diagnostics.metrics` (below both ``compare`` and ``report``, so the
imports run one way); kept so existing imports keep working."""

from __future__ import annotations

from diagnostics.metrics import KeyMetrics, compute_key_metrics, key_metrics

__all__ = ["KeyMetrics", "compute_key_metrics", "key_metrics"]
