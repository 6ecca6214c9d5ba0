import sys, torch
from v4serve.bench.shapes import sparse_prefill_case, sparse_decode_case
from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton
kind = sys.argv[1]
case = sparse_prefill_case(0, 8192, 0, "cuda") if kind == "prefill" else sparse_decode_case(0, 1, 32767, "cuda")
cfg = None if kind == "prefill" else dict(KERNEL="ws", BLOCK_T=64, KV_STAGES=2)
for _ in range(3):
    sparse_attn_paged_triton(*case.args(), tile_config=cfg)
torch.cuda.synchronize()
