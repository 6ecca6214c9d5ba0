"""Tensor / expert parallelism as a transformation of the built model (gpt-fast's style): the
modules keep their names and their forward code; `shard_model` cuts their parameters to this
rank's part, records each cut (`ShardSpec`, which the weights read through) and binds the
collectives as module hooks. With N ranks, rank r:

attention (per layer), heads in the output groups' order (group g owns heads g*H/G .. (g+1)*H/G - 1):
    q_b_proj rows, sinks: the heads of groups [r*G/N, (r+1)*G/N)
    o_a_proj rows ([G, o_rank, H*D/G] viewed): those groups;  o_b_proj columns: those groups' o_rank
    out = sum_r o_b_proj_r(z_r)            -> one all-reduce of [T, hidden] per attention sublayer
  replicated: q_a_proj / q_a_norm (the low-rank q, which the indexer reads too), the latent kv_proj
  and kv_norm, the compressor and the indexer. The KV is ONE latent head (K = V) that every query
  head reads, and the indexer's top-k is one selection per token shared by all heads: splitting
  heads does not split them, and splitting the indexer's heads would add an all-reduce of index
  scores per CSA layer. Each rank therefore keeps the whole (replicated) KV cache and computes the
  compressor / indexer itself (no collective; cheap beside the heads' attention).
MoE (per layer):
    router, hash table: replicated (every rank routes every token identically)
    shared expert: gate/up rows and down columns split by intermediate channel (TP)
    routed experts, TP: gate_up_proj rows [gate_r; up_r] and down_proj columns by intermediate channel
    routed experts, EP (`enable_expert_parallel`): experts [r*E/N, (r+1)*E/N); picks of other ranks'
      experts get weight 0 here (they are computed against a local expert and dropped: exact, but
      a dispatch that compacts the local picks would save that compute)
    out = shared_r + routed_r summed over ranks  -> one all-reduce per MoE sublayer
embedding: vocabulary rows [r*V/N, (r+1)*V/N); other ids give zeros; all-reduce (exact: one nonzero term)
lm_head: vocabulary rows likewise; logits all-gathered along the vocabulary
mHC, norms, the head's hyper-connection: replicated.
Quantized modules (`shard_quantized.py`): an FP8Linear is cut with its block scales and only on
whole blocks, MXFP4 experts with their ue8m0 bytes on whole 32-channel groups; a cut inside a block
raises naming the layer. o_a_proj is FP8 (`FP8GroupedLinear`) where each group's rows are whole
scale blocks, so a cut by groups is one on whole blocks; where they are not, it is dequantized at
load and each rank dequantizes the blocks its rows touch (`ShardSpec.read_dequantized`).

The sums run in a different order than one process's GEMMs: float results agree to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from v4serve.model.quantized import FP8Linear, MXFP4Experts
from v4serve.parallel.group import Group
from v4serve.parallel.shard_quantized import cut_fp8_linear, cut_mxfp4_experts, runs


@dataclass(frozen=True)
class ShardSpec:
    """This rank keeps indices `keep` (sorted) along `dim` of a parameter of `full_shape`."""

    dim: int
    keep: tuple[int, ...]
    full_shape: tuple[int, ...]

    def take(self, full: torch.Tensor) -> torch.Tensor:
        return full.index_select(self.dim, torch.tensor(self.keep, device=full.device))

    def copy_part(self, dest: torch.Tensor, expert: int | None, values: torch.Tensor) -> None:
        """Write the full parameter's values (or expert `expert`'s, [full_shape[1:]]) into `dest`."""
        if expert is None:
            dest.copy_(self.take(values))
        elif self.dim == 0:
            if expert in self.keep:
                dest[self.keep.index(expert)].copy_(values)
        else:
            index = torch.tensor(self.keep, device=values.device)
            dest[expert].copy_(values.index_select(self.dim - 1, index))

    def read(self, handle, dest: torch.Tensor, expert: int | None, rows: slice | None
             ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(destination view, tensor) of a checkpoint tensor (a safetensors slice `handle`) that
        stands for `param[expert][rows]`; only this rank's part is read. None: another rank's expert."""
        if expert is not None and self.dim == 0:
            if expert not in self.keep:
                return None
            dest = dest[self.keep.index(expert)]
            return (dest if rows is None else dest[rows]), handle[:]
        if expert is not None:
            dest, dim = dest[expert], self.dim - 1
        else:
            dest, dim = dest, self.dim
        if rows is not None and dim == 0:  # the half of a fused tensor the source fills
            inside = [(i, k - rows.start) for i, k in enumerate(self.keep) if rows.start <= k < rows.stop]
            return dest[inside[0][0]:inside[-1][0] + 1], _read_runs(handle, 0, [k for _, k in inside])
        if rows is not None:
            dest = dest[rows]
        return dest, _read_runs(handle, dim, list(self.keep))

    def read_dequantized(self, weight, scale, block: tuple[int, int], fp32_scale, device) -> torch.Tensor:
        """This rank's part (float32) of an FP8 weight dequantized at load (`o_a_proj`), from the
        safetensors slices of its e4m3 codes and block scales: only the scale blocks the kept
        indices touch are read (whole blocks, so a cut inside a block needs no other rank's bytes)."""
        from v4serve.ops.weight_formats import dequantize_fp8_blocks

        b, total = block[self.dim], self.full_shape[self.dim]
        blocks = sorted({k // b for k in self.keep})
        index = [i for blk in blocks for i in range(blk * b, min((blk + 1) * b, total))]
        codes = _read_runs(weight, self.dim, index).view(torch.float8_e4m3fn).to(device)
        values = dequantize_fp8_blocks(codes, fp32_scale(_read_runs(scale, self.dim, blocks)), block)
        where = {k: i for i, k in enumerate(index)}
        return values.index_select(self.dim, torch.tensor([where[k] for k in self.keep], device=device))


def refuse_unsupported(cpu_offload_gb: float | str = 0, tensor_parallel_size: int | None = None) -> None:
    """What tensor_parallel_size > 1 does not do yet (future work), as a ValueError naming the flag:
    `cpu_offload_gb` != 0 (offloaded experts are not cut yet). `tensor_parallel_size` None: a
    sharded build (> 1)."""
    if tensor_parallel_size is not None and tensor_parallel_size <= 1:
        return
    tp = f"tensor_parallel_size {tensor_parallel_size}" if tensor_parallel_size else "tensor_parallel_size > 1"
    if cpu_offload_gb not in (0, 0.0):
        raise ValueError(f"{tp} with cpu_offload_gb={cpu_offload_gb!r}: "
                         "sharding offloaded experts is not supported yet (future work); use cpu_offload_gb=0")


def _read_runs(handle, dim: int, index: list[int]) -> torch.Tensor:
    """handle[..., index, ...] along `dim`, reading contiguous runs only (safetensors get_slice)."""
    parts = [handle[(slice(None),) * dim + (slice(a, b),)] for a, b in runs(index)]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


class VocabShardEmbedding(nn.Embedding):
    """Rows [start, start + num_embeddings) of the vocabulary; the other ids' rows come from the
    other ranks through one all-reduce."""

    def __init__(self, template: nn.Embedding, start: int, rows: int, group: Group):
        super().__init__(rows, template.embedding_dim, device=template.weight.device, dtype=template.weight.dtype)
        self.start, self.group = start, group

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        inside = (local >= 0) & (local < self.num_embeddings)
        out = F.embedding(local.clamp(0, self.num_embeddings - 1), self.weight) * inside[..., None].to(self.weight.dtype)
        return self.group.all_reduce(out)


def _split(total: int, size: int, rank: int, what: str) -> range:
    if total % size:
        raise ValueError(f"{what} ({total}) must be divisible by tensor_parallel_size ({size})")
    part = total // size
    return range(rank * part, (rank + 1) * part)


class _Sharder:
    def __init__(self, model: nn.Module, group: Group):
        self.model, self.group, self.specs = model, group, {}
        self.names = {id(p): n for n, p in model.named_parameters()}
        self.modules = {id(m): n for n, m in model.named_modules()}

    def module_name(self, module: nn.Module) -> str:
        return self.modules[id(module)]

    def cut_linear(self, module: nn.Module, dim: int, keep: list[int]) -> None:
        """A linear's output rows (dim 0) or input columns (dim 1); FP8 ones on whole scale blocks."""
        if isinstance(module, FP8Linear):
            cut_fp8_linear(self, module, dim, keep)
        else:
            self.cut(module, "weight", dim, keep)

    def cut_experts(self, module: nn.Module, intermediate: range, experts: range | None) -> None:
        """Routed experts: by expert (EP, `experts`) or by intermediate channel (TP)."""
        if isinstance(module, MXFP4Experts):
            cut_mxfp4_experts(self, module, None if experts is not None else intermediate, experts)
        elif experts is not None:
            self.cut(module, "gate_up_proj", 0, list(experts))
            self.cut(module, "down_proj", 0, list(experts))
        else:
            inter = module.down_proj.shape[2]
            self.cut(module, "gate_up_proj", 1, [*intermediate, *(inter + i for i in intermediate)])
            self.cut(module, "down_proj", 2, list(intermediate))

    def cut(self, module: nn.Module, attr: str, dim: int, keep: list[int]) -> None:
        """Replace `module.<attr>` by its rows `keep` along `dim` (on any device, meta included)."""
        p = getattr(module, attr)
        name = self.names[id(p)]
        self.specs[name] = spec = ShardSpec(dim, tuple(keep), tuple(p.shape))
        with torch.no_grad():
            cut = p.data.index_select(dim, torch.tensor(keep, device=p.device)) if p.device.type != "meta" else \
                torch.empty(*(len(keep) if d == dim else s for d, s in enumerate(p.shape)), dtype=p.dtype, device="meta")
        setattr(module, attr, nn.Parameter(cut, requires_grad=False))
        assert tuple(getattr(module, attr).shape)[dim] == len(spec.keep)


def _all_reduce_output(group: Group):
    return lambda module, args, out: group.all_reduce(out)


def shard_model(model: nn.Module, group: Group, expert_parallel: bool = False) -> dict[str, ShardSpec]:
    """Cut `model` (a DeepseekV4ForCausalLM, on "meta" or materialised) to rank `group.rank`'s part
    and bind its collectives; returns the cut parameters' specs by name (for the weights)."""
    config = model.config
    if config.v41 is not None:
        raise NotImplementedError("tensor_parallel_size > 1 for DeepSeek-V4.1 (its FP4 experts' block "
                                  "quantisation spans the intermediate dimension)")
    n, r = group.size, group.rank
    s = _Sharder(model, group)
    h, d, g = config.num_attention_heads, config.head_dim, config.o_groups
    groups = _split(g, n, r, "o_groups")
    heads = range(groups.start * h // g, groups.stop * h // g)
    o_rank = config.o_lora_rank
    o_cols = list(range(groups.start * o_rank, groups.stop * o_rank))
    local_i = _split(config.moe_intermediate_size, n, r, "moe_intermediate_size")
    shared_i = _split(config.moe_intermediate_size * config.n_shared_experts, n, r,
                      "moe_intermediate_size * n_shared_experts")
    experts = _split(config.n_routed_experts, n, r, "n_routed_experts") if expert_parallel else None
    for layer in model.model.layers:
        attn = layer.self_attn
        s.cut_linear(attn.q_b_proj, 0, [i for hh in heads for i in range(hh * d, (hh + 1) * d)])
        s.cut_linear(attn.o_a_proj, 0, o_cols)  # FP8 on whole blocks, or dequantized at load
        s.cut_linear(attn.o_b_proj, 1, o_cols)
        s.cut(attn, "sinks", 0, list(heads))
        attn.n_heads, attn.o_groups = len(heads), len(groups)
        attn.register_forward_hook(_all_reduce_output(group))
        mlp = layer.mlp
        s.cut_linear(mlp.shared_experts.gate_proj, 0, list(shared_i))
        s.cut_linear(mlp.shared_experts.up_proj, 0, list(shared_i))
        s.cut_linear(mlp.shared_experts.down_proj, 1, list(shared_i))
        s.cut_experts(mlp.experts, local_i, experts)
        if experts is not None:
            mlp.experts.register_forward_pre_hook(_local_experts(experts.start, len(experts)), with_kwargs=True)
        mlp.register_forward_hook(_all_reduce_output(group))
    vocab = _split(config.vocab_size, n, r, "vocab_size")
    embed = model.model.embed_tokens
    name = s.names[id(embed.weight)]
    s.specs[name] = ShardSpec(0, tuple(vocab), tuple(embed.weight.shape))
    local_embed = VocabShardEmbedding(embed, vocab.start, len(vocab), group)
    if embed.weight.device.type != "meta":
        local_embed.weight.data.copy_(s.specs[name].take(embed.weight.data))
    local_embed.weight.requires_grad_(False)
    model.model.embed_tokens = local_embed
    s.cut(model.lm_head, "weight", 0, list(vocab))
    model.lm_head.register_forward_hook(lambda module, args, out: group.all_gather(out, dim=-1))
    model.shard_specs = s.specs
    return s.specs


def _local_experts(first: int, count: int):
    """Forward pre-hook of EP RoutedExperts: global expert ids -> local ids; other ranks' picks get
    weight 0 (and a local id, so the sort stays in range)."""

    def hook(module, args, kwargs):
        x, experts, weights = args
        local = experts - first
        mine = (local >= 0) & (local < count)
        return (x, torch.where(mine, local, 0), weights * mine.to(weights.dtype)), kwargs

    return hook
