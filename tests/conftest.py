import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).parent))

import a2ats_engine  # noqa: E402,F401  (BLAS preload before anything imports mlx.core)
