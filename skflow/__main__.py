"""``python -m skflow``: see :mod:`skflow.cli`."""

from skflow.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
