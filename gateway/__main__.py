"""``python -m gateway``: the same as ``asbp broker``."""

from __future__ import annotations

import sys

from gateway.ops.cli import main

if __name__ == "__main__":
    sys.exit(main(["broker", *sys.argv[1:]], prog="python -m gateway"))
