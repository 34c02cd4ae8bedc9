"""``python -m skflow``: see :mod:`skflow.cli`."""

import sys

from skflow.cli import main

if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
