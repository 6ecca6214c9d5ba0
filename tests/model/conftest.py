import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
# Tiny models: one thread is several times faster than two fighting over a busy CI core.
torch.set_num_threads(1)
