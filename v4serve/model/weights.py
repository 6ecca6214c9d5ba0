"""Checkpoint weights: safetensors files (single or sharded) under either naming scheme.

Our module tree uses transformers' names (`model.layers.N.self_attn.q_a_proj.weight`, fused
`mlp.experts.gate_up_proj`, ...). The official checkpoint's names (`layers.N.attn.wq_a.weight`,
per-expert `layers.N.ffn.experts.E.w1.weight`, ...) are mapped onto them by ONE declared table,
`OFFICIAL_NAMES`, plus the per-expert rule `official_expert_target`. Missing, unexpected or
wrongly shaped tensors are collected and reported together in one `WeightsError`, every name
listed, with names that differ only in layer / expert indices merged into one line.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from v4serve.config import ModelConfig

# Official suffix under `layers.N.` -> transformers suffix under `model.layers.N.`.
OFFICIAL_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "hc_attn_fn": "attn_hc.fn",
    "hc_attn_base": "attn_hc.base",
    "hc_attn_scale": "attn_hc.scale",
    "hc_ffn_fn": "ffn_hc.fn",
    "hc_ffn_base": "ffn_hc.base",
    "hc_ffn_scale": "ffn_hc.scale",
    "attn.wq_a.weight": "self_attn.q_a_proj.weight",
    "attn.q_norm.weight": "self_attn.q_a_norm.weight",
    "attn.wq_b.weight": "self_attn.q_b_proj.weight",
    "attn.wkv.weight": "self_attn.kv_proj.weight",
    "attn.kv_norm.weight": "self_attn.kv_norm.weight",
    "attn.norm.weight": "self_attn.kv_norm.weight",  # how transformers' save_pretrained spells it
    "attn.wo_a.weight": "self_attn.o_a_proj.weight",
    "attn.wo_b.weight": "self_attn.o_b_proj.weight",
    "attn.attn_sink": "self_attn.sinks",
    "attn.compressor.wkv.weight": "self_attn.compressor.kv_proj.weight",
    "attn.compressor.wgate.weight": "self_attn.compressor.gate_proj.weight",
    "attn.compressor.ape": "self_attn.compressor.position_bias",
    "attn.compressor.norm.weight": "self_attn.compressor.kv_norm.weight",
    "attn.indexer.wq_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
    "attn.indexer.weights_proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
    "attn.indexer.compressor.wkv.weight": "self_attn.compressor.indexer.kv_proj.weight",
    "attn.indexer.compressor.wgate.weight": "self_attn.compressor.indexer.gate_proj.weight",
    "attn.indexer.compressor.ape": "self_attn.compressor.indexer.position_bias",
    "attn.indexer.compressor.norm.weight": "self_attn.compressor.indexer.kv_norm.weight",
    "ffn.gate.weight": "mlp.gate.weight",
    "ffn.gate.bias": "mlp.gate.e_score_correction_bias",
    "ffn.gate.tid2eid": "mlp.gate.tid2eid",
    "ffn.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
    "ffn.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
}
OFFICIAL_TOP_NAMES = {
    "embed.weight": "model.embed_tokens.weight",
    "head.weight": "lm_head.weight",
    "norm.weight": "model.norm.weight",
    "hc_head_fn": "model.hc_head.hc_fn",
    "hc_head_base": "model.hc_head.hc_base",
    "hc_head_scale": "model.hc_head.hc_scale",
}
_OFFICIAL_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_OFFICIAL_EXPERT = re.compile(r"^layers\.(\d+)\.ffn\.experts\.(\d+)\.(w1|w2|w3)\.weight$")
# Tensors of the checkpoint we do not run (multi-token prediction) are skipped.
_IGNORED = re.compile(r"^(model\.)?mtp\.")
_UNSUPPORTED_DTYPES = {"F8_E4M3", "F8_E5M2", "F8_E8M0", "I8", "U8", "F4"}
# A whole dotted component of digits in a tensor name: a layer or an expert index.
_INDEX = re.compile(r"(?<=\.)\d+(?=\.)")


class WeightsError(ValueError):
    """The checkpoint does not match the model: every problem is listed."""


@dataclass(frozen=True)
class Target:
    """Where a checkpoint tensor goes: a parameter, or a slice `[expert, rows]` of a fused one."""

    name: str
    expert: int | None = None
    rows: slice | None = None


def official_expert_target(layer: int, expert: int, which: str, intermediate: int) -> Target:
    """w1 (gate) and w3 (up) are the two halves of the fused `gate_up_proj`; w2 is `down_proj`."""
    prefix = f"model.layers.{layer}.mlp.experts."
    if which == "w2":
        return Target(prefix + "down_proj", expert)
    half = slice(0, intermediate) if which == "w1" else slice(intermediate, 2 * intermediate)
    return Target(prefix + "gate_up_proj", expert, half)


def official_target(name: str, config: ModelConfig) -> Target | None:
    """Map an official checkpoint name onto our parameter; None if it is not an official name.
    transformers' `save_pretrained` writes official per-layer names under a `model.` prefix."""
    name = name.removeprefix("model.")
    if name in OFFICIAL_TOP_NAMES:
        return Target(OFFICIAL_TOP_NAMES[name])
    m = _OFFICIAL_EXPERT.match(name)
    if m:
        return official_expert_target(int(m[1]), int(m[2]), m[3], config.moe_intermediate_size)
    m = _OFFICIAL_LAYER.match(name)
    if m and m[2] in OFFICIAL_LAYER_NAMES:
        return Target(f"model.layers.{m[1]}.{OFFICIAL_LAYER_NAMES[m[2]]}")
    return None


def checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise WeightsError(f"{index} names shards that do not exist: {missing}")
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {path}")
    return files


def load_weights(model: torch.nn.Module, path: str | Path, config: ModelConfig, progress: bool = True,
                 shards: dict | None = None) -> None:
    """Copy a checkpoint into `model` (parameters and buffers, cast to their dtype). `shards`: the
    cut parameters of one tensor-parallel rank (`parallel/shard.py`), whose part alone is read."""
    path = Path(path)
    params = dict(model.named_parameters()) | dict(model.named_buffers())
    loaded: dict[str, set] = {name: set() for name in params}
    unexpected, bad_shape, unsupported = [], [], []
    files = checkpoint_files(path)
    handles = [safe_open(str(file), framework="pt") for file in files]
    total = sum(len(list(f.keys())) for f in handles)
    with tqdm(total=total, desc="Loading weights", unit="tensor", disable=not progress) as bar:
        for f in handles:
            for key in f.keys():
                bar.update(1)
                if _IGNORED.match(key):
                    continue
                target = Target(key) if key in params else official_target(key, config)
                if target is None or target.name not in params:
                    unexpected.append(key)
                    continue
                dtype = f.get_slice(key).get_dtype()
                if dtype in _UNSUPPORTED_DTYPES:
                    unsupported.append(f"{key} ({dtype})")
                    continue
                if shards and target.name in shards:
                    placed = shards[target.name].read(f.get_slice(key), params[target.name], target.expert, target.rows)
                    if placed is None:  # another rank's expert
                        continue
                    dest, tensor = placed
                else:
                    dest = params[target.name]
                    if target.expert is not None:
                        dest = dest[target.expert]
                    if target.rows is not None:
                        dest = dest[target.rows]
                    tensor = f.get_tensor(key)
                if tuple(tensor.shape) != tuple(dest.shape):
                    bad_shape.append(f"{key}: checkpoint {tuple(tensor.shape)}, model {tuple(dest.shape)}")
                    continue
                with torch.no_grad():
                    dest.copy_(tensor.to(dest.dtype))
                loaded[target.name].add((target.expert, None if target.rows is None else target.rows.start))
    if unsupported:
        raise WeightsError(
            "quantized (FP8/FP4) checkpoint tensors are not supported yet; dequantize to bf16 first. "
            f"{len(unsupported)} tensors, e.g. " + ", ".join(unsupported[:5])
        )
    missing = [name for name, parts in loaded.items() if not parts or not _complete(name, parts, params, config)]
    problems = [
        f"{what} ({len(names)}):" + "".join(f"\n    {line}" for line in compact_names(names))
        for what, names in (("missing tensors", missing), ("unexpected tensors", unexpected),
                            ("tensors with the wrong shape", bad_shape))
        if names
    ]
    if problems:
        raise WeightsError(f"checkpoint {path} does not match the model config:\n  " + "\n  ".join(problems))


def _complete(name: str, parts: set, params: dict[str, torch.Tensor], config: ModelConfig) -> bool:
    """Whole tensors are complete once loaded; fused expert tensors need every expert (and both halves)."""
    if (None, None) in parts:
        return True
    n_experts = params[name].shape[0]
    halves = 2 if name.endswith("gate_up_proj") else 1
    return len(parts) == n_experts * halves


def compact_names(names: list[str]) -> list[str]:
    """Every name, with those that differ only in their layer / expert indices merged into one
    line such as `model.layers.{0-3,5}.self_attn.q_a_proj.weight`: a checkpoint with thousands of
    problems still gives an error one can read, and it still names every tensor. Text after the
    name (a shape mismatch) must be equal too. Names of one pattern stay where its first one was."""
    groups: dict[tuple[str, ...], list[tuple[int, ...]]] = {}
    for name in names:
        groups.setdefault(tuple(_INDEX.split(name)), []).append(tuple(int(i) for i in _INDEX.findall(name)))
    return [
        "".join(text + index for text, index in zip(texts, (*row, "")))
        for texts, rows in groups.items()
        for row in _merge_indices(sorted(set(rows)))
    ]


def _merge_indices(rows: list[tuple[int, ...]]) -> list[tuple[str, ...]]:
    """Index tuples merged one position at a time, innermost (expert) first: rows equal but at that
    position become one row holding the range text of their values there. The result stands for
    exactly the input: layers merge only when their expert sets are equal."""
    for j in reversed(range(len(rows[0]))):
        merged: dict[tuple, list[int]] = {}
        for row in rows:
            merged.setdefault(row[:j] + row[j + 1:], []).append(row[j])
        rows = [rest[:j] + (_ranges(values),) + rest[j:] for rest, values in merged.items()]
    return rows


def _ranges(values: list[int]) -> str:
    """[3] -> "3"; [5, 0, 1, 2, 3] -> "{0-3,5}"."""
    if len(values) == 1:
        return str(values[0])
    values = sorted(values)
    runs, start = [], values[0]
    for previous, value in zip(values, [*values[1:], None]):
        if value != previous + 1:
            runs.append(str(start) if start == previous else f"{start}-{previous}")
            start = value
    return "{" + ",".join(runs) + "}"
