"""Trace loading: Chrome-trace JSON (any Kineto version, one file per rank) -> event table.

``schema`` is the contract (EVENT_SCHEMA, TraceMetadata, LoadedTrace); ``loader.load`` is
the one entry point; ``source`` reads bytes with a size cap, ``decode`` turns them into
columns, ``normalise`` into the event table.
"""
