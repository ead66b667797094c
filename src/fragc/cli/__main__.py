"""`python -m fragc.cli`: the `fragc` command."""

import sys

from fragc.cli import console_main

sys.exit(console_main())
