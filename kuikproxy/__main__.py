"""``python -m kuikproxy``: the same as the ``kuikproxy`` command."""

import sys

from kuikproxy.cli import main

sys.exit(main())
