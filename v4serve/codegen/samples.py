"""Canary kernels: the access patterns of the production kernels, small and fixed.

They are registered beside the project's kernels so that a toolchain change shows up against
code that does not move: a plain 16-byte row gather, the per-column window/compressed gather
with its alignment hint, a packed-row gather in 4-byte words, and a ``tl.dot`` score tile.
"""
import triton
import triton.language as tl


@triton.jit
def _gather_rows_kernel(src_ptr, idx_ptr, out_ptr, num_rows, stride_src, stride_out,
                        BLOCK_M: tl.constexpr, D: tl.constexpr):
    """out[m, :] = src[idx[m], :]; idx == -1 is a hole (zeros)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, D)
    idx = tl.load(idx_ptr + rows, mask=rows < num_rows, other=-1)
    live = (idx >= 0)[:, None]
    x = tl.load(src_ptr + idx[:, None] * stride_src + cols[None, :], mask=live, other=0.0)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], x, mask=(rows < num_rows)[:, None])


@triton.jit
def _window_gather_kernel(win_ptr, cmp_ptr, idx_ptr, out_ptr, n_window, stride_row,
                          BLOCK_N: tl.constexpr, D: tl.constexpr):
    """out[n, :] = (win if n < n_window else cmp)[idx[n], :], one base pointer per column.

    NOTE: the ``tl.multiple_of`` on the selected base keeps 16-byte loads under Triton >= 3.8,
    which otherwise loses the alignment of a ``tl.where`` between two pointers.
    """
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    idx = tl.load(idx_ptr + cols)
    base = tl.multiple_of(tl.where(cols < n_window, win_ptr, cmp_ptr), 16)
    d = tl.arange(0, D)
    kv = tl.load(base[:, None] + idx[:, None] * stride_row + d[None, :], mask=(idx >= 0)[:, None], other=0.0)
    tl.store(out_ptr + cols[:, None] * D + d[None, :], kv)


@triton.jit
def _word_gather_kernel(pool_ptr, idx_ptr, out_ptr, stride_row_words,
                        BLOCK_N: tl.constexpr, WORDS: tl.constexpr, WORDS_POW2: tl.constexpr):
    """Copy packed rows of WORDS int32 words (e.g. 16 words of fp4 codes + 1 word of scales).

    The row stride (17 words = 68 B) is 4-byte aligned only, so words are the widest safe load.
    """
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    idx = tl.load(idx_ptr + cols)
    w = tl.arange(0, WORDS_POW2)
    mask = (idx >= 0)[:, None] & (w < WORDS)[None, :]
    words = tl.load(pool_ptr + idx[:, None] * stride_row_words + w[None, :], mask=mask, other=0)
    tl.store(out_ptr + cols[:, None] * WORDS_POW2 + w[None, :], words)


@triton.jit
def _score_tile_kernel(q_ptr, k_ptr, out_ptr, num_keys, stride_q, stride_k,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                       BLOCK_D: tl.constexpr):
    """out[m, n] = sum_d q[m, d] * k[n, d] over one [BLOCK_M, BLOCK_N] tile, K-loop over D."""
    m = tl.arange(0, BLOCK_M)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for d0 in tl.range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        q = tl.load(q_ptr + m[:, None] * stride_q + d[None, :])
        k = tl.load(k_ptr + n[:, None] * stride_k + d[None, :], mask=(n < num_keys)[:, None], other=0.0)
        acc = tl.dot(q, tl.trans(k), acc)
    tl.store(out_ptr + m[:, None] * BLOCK_N + (n - tl.program_id(0) * BLOCK_N)[None, :], acc)
