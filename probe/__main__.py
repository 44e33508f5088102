"""``python -m probe profile ...``: the same command as ``pipeline-doctor profile ...``."""

import sys

from probe.cli import main

sys.exit(main())
