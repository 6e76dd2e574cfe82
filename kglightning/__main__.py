"""``python -m kglightning``."""

import sys

from kglightning.cli import main

if __name__ == "__main__":
    sys.exit(main())
