"""``python -m kglightning``."""

import sys

from kglightning.cli import main

if __name__ == "__main__":
    result = main()
    sys.exit(result if isinstance(result, int) else 0)
