"""Streamlit-side helpers shared by the pages: page setup, cached loaders, rendering.

The pages call these so each page stays "widgets -> one call -> render". Anything that is
not about drawing lives in ``diagnostics.views`` (pure, tested without a browser).
"""
