"""CUDA memory snapshots: read safely (reader), typed (schema), analysed (analysis)."""
