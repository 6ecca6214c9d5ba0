"""Tensor-parallel tests reuse the transformers oracle checkpoints of tests/model."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "model"))
