"""``python -m streamd.conformance verify|record ...``, the same as ``streamd conformance``."""

import sys

from streamd.conformance.cli import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
