"""Triton kernels of the FP8 block-scaled linear (in progress)."""


def fp8_linear_triton(x, weight, scale, block, act_block):
    raise NotImplementedError("the Triton FP8 linear has not landed yet: use impl='torch'")


def act_quant_triton(x, block):
    raise NotImplementedError("the Triton activation quantization has not landed yet: use impl='torch'")
