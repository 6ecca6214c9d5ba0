"""Count the kernels one decode step launches, on the CPU (no GPU needed): per source line.

    TRITON_INTERPRET=1 PYTHONPATH=. python scripts/decode_launches.py [--layers 8]

Builds the deepseek-v4-flash preset at toy widths with the Flash layer pattern (ratios 0 0 4 128
...), official FP8 / MXFP4 formats and packed KV, prefills a prompt with the torch kernels, then
runs one decode step with kernels="triton" under the Triton interpreter and logs every Triton
launch (by kernel) and every torch op that launches a kernel on the GPU (views, allocations and
casts to the same dtype left out), by the v4serve line that issued it. cuBLAS picks (split-K and
its reduction) and the FP8 linear's split-K sums are decided on the GPU and do not show here.
"""

import argparse
import collections
import os
import sys
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import triton_interpreter_bf16  # noqa: E402  (the interpreter computes bf16 as the GPU does)
from triton.runtime import interpreter  # noqa: E402

from v4serve.engine import Engine, EngineArgs, SamplingParams  # noqa: E402

NO_KERNEL = {"view", "_unsafe_view", "t", "transpose", "unsqueeze", "squeeze", "select", "slice", "split",
             "split_with_sizes", "expand", "permute", "as_strided", "detach", "empty", "empty_like", "unflatten",
             "alias", "lift_fresh", "_reshape_alias", "reshape", "unbind", "chunk", "empty_strided", "new_empty",
             "diagonal", "flatten", "narrow", "item", "_local_scalar_dense"}


class LaunchLog(TorchDispatchMode):
    """Torch ops that launch kernels, by the innermost v4serve line (Triton launches: `triton_run`)."""

    def __init__(self):
        super().__init__()
        self.launches = collections.Counter()
        self.inside_triton = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        no_op = name in ("to", "contiguous") and out is args[0]  # already that dtype / layout
        if not self.inside_triton and name not in NO_KERNEL and not no_op:
            frames = [f for f in traceback.extract_stack() if "/v4serve/" in f.filename]
            where = f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else "?"
            self.launches[f"torch {name} ({where})"] += 1
        return out

    def triton_run(self, run):
        def logged(fn, *args, **kwargs):
            self.launches[f"triton {fn.fn.__name__}"] += 1
            self.inside_triton += 1  # the interpreter's own tensor copies are not launches
            try:
                return run(fn, *args, **kwargs)
            finally:
                self.inside_triton -= 1
        return logged


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run with TRITON_INTERPRET=1 (the Triton kernels run in the interpreter)")
    triton_interpreter_bf16.apply()
    ratios = ([0, 0] + [4, 128] * args.layers)[:args.layers]
    overrides = {"num_hidden_layers": args.layers, "compress_ratios": ratios, "hidden_size": 256,
                 "num_attention_heads": 4, "q_lora_rank": 128, "o_lora_rank": 128, "o_groups": 2,
                 "n_routed_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 128, "vocab_size": 512,
                 "index_n_heads": 4, "index_topk": 8}
    engine = Engine(EngineArgs(model="deepseek-v4-flash", hf_overrides=overrides, device="cpu", dtype="bfloat16",
                               max_model_len=1024, max_num_seqs=1, max_num_batched_tokens=512, kv_cache_dtype="auto",
                               kernels="torch", cuda_graphs=False))
    engine.add_request("r", list(range(2, 301)), SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    engine.step()  # the prompt; the decode token at position 299 completes a ratio-4 block
    engine.model.bind_kernels("triton")
    batch = engine.cache.build_decode_batch(torch.tensor([5]), torch.tensor([299]), torch.tensor([0]))
    log = LaunchLog()
    interpreter.InterpretedFunction.run = log.triton_run(interpreter.InterpretedFunction.run)
    with torch.inference_mode(), log:
        engine.model(batch, engine.cache)
    for name, count in sorted(log.launches.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"{count:5d}  {name}")
    triton_total = sum(c for n, c in log.launches.items() if n.startswith("triton"))
    print(f"{triton_total} Triton launches, {sum(log.launches.values()) - triton_total} torch launches")


if __name__ == "__main__":
    main()
