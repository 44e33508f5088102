"""Trace loading: Chrome-trace JSON (any Kineto version, one file per rank) -> event table.

``schema`` is the contract (EVENT_SCHEMA, TraceMetadata, LoadedTrace); ``loader.load`` is
the one entry point. Underneath: ``source`` reads bytes with a size cap, ``decode`` cuts
the JSON into chunks of whole events, ``columns`` turns each chunk into polars columns and
``normalise`` into the event table.
"""
