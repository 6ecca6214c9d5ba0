"""Test setup: without a CUDA device, Triton kernels run in the interpreter with bf16 fixed up.

TRITON_INTERPRET must be set before triton is first imported, hence at the top of this file.
"""

import os
import sys

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

sys.path.insert(0, os.path.dirname(__file__))

if not HAS_CUDA:
    import triton_interpreter_bf16
    import triton_interpreter_scope

    triton_interpreter_bf16.apply()
    triton_interpreter_scope.apply()
