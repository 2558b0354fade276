"""``python -m ndp.cli``: the ``ndp`` command."""

import sys

from ndp.cli.main import main

sys.exit(main())
