"""Triton kernel of the MXFP4 grouped matmul (in progress)."""


def mxfp4_grouped_matmul_triton(x, weight, scale, rows, ends, n_picks):
    raise NotImplementedError("the Triton MXFP4 grouped matmul has not landed yet: use impl='torch'")
