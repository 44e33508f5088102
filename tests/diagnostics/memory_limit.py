"""An address-space limit that the largest shared trace cannot be analysed in, for the
tests of how an analysis stopped by its memory limit reads.

The 216k-event trace needs ~220 MB resident on top of the ~415 MiB its analysing process
has mapped once its imports are done (polars' library alone maps 130 MiB): at 450 MiB it
failed while the trace was being read in each of 32 runs here, with one polars thread and
with two. The 600 MiB used before had become too close to what the analysis needs: it
finished there in one CI run, and at 650 MiB in 9 of 16 runs here.
"""

from __future__ import annotations

from tests.diagnostics.trace.helpers import SHARED_TRACES

LARGE = SHARED_TRACES / "hta_v100_rank1_of_2_large.json.gz"
TOO_LITTLE_MIB = 450
TOO_LITTLE_SHOWN = f"{TOO_LITTLE_MIB:.1f} MiB"
