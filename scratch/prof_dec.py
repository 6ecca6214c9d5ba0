import sys, torch
from v4serve.bench.shapes import sparse_decode_case
from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton
ratio, B, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
case = sparse_decode_case(ratio, B, 32767, "cuda")
cfg = {"tl": None, "ws": dict(KERNEL="ws", BLOCK_T=64, KV_STAGES=2),
       "ws64": dict(KERNEL="ws", BLOCK_T=32, KV_STAGES=4, COLS_PER_SPLIT=64, PDL=True)}[mode]
for _ in range(int(sys.argv[4]) if len(sys.argv) > 4 else 5):
    sparse_attn_paged_triton(*case.args(), tile_config=cfg)
torch.cuda.synchronize()
