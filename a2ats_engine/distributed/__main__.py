"""`mlx.launch ... -m a2ats_engine.distributed --model SOURCE`: chat over several ranks."""

import sys

from .chat import main

sys.exit(main())
