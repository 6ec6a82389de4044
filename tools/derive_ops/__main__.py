"""``python -m tools.derive_ops [--write]``: see ``derive.py``."""

import sys

from .derive import main

sys.exit(main())
