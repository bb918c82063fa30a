"""Calibration defaults without MLX: `a2ats calibrate --help` and `a2ats bench --help` show them
without importing the calibration itself (`calibrate.py` re-exports them; why these numbers:
`calibrate.DEMO_SIZING`)."""

from __future__ import annotations

DEFAULT_MAX_ITERS = 10  # measured: the held-out error stops improving after about 8
DEMO_CENTROIDS = 512
DEMO_TOKENS = 12288
