"""``python -m trainer run|resume|list``: see trainer/cli.py."""

import sys

from trainer.cli import main

sys.exit(main())
