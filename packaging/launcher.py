"""Entry script of the packaged app: the same `main()` as the `a2ats-chat` command."""

import sys

import a2ats_engine  # noqa: F401  (BLAS preload before mlx.core)
from app.main import main

if __name__ == "__main__":
    sys.exit(main())
