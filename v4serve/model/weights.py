"""Checkpoint weights: safetensors files (single or sharded) under either naming scheme.

Our module tree uses transformers' names (`model.layers.N.self_attn.q_a_proj.weight`, fused
`mlp.experts.gate_up_proj`, ...). The official checkpoint's names (`layers.N.attn.wq_a.weight`,
per-expert `layers.N.ffn.experts.E.w1.weight`, ...) are mapped onto them by the declared tables
and the per-expert rule of `official_names.py`.

Quantized tensors: an F8_E4M3 weight's scale is `X.scale` (official, F8_E8M0 or F32) or
`X.weight_scale_inv` (transformers); a packed e2m1 expert weight (I8 / U8 / F4) has `X.scale`
(F8_E8M0, [N, K/32]) or, fused, `...experts.gate_up_proj_scale_inv`. A scale may sit in any
shard. Our scale parameters are named weight parameter + `_scale_inv` (model/quantized.py).

Loading is two passes. `scan_checkpoint` reads only the shard headers (`safetensors_files.py`:
the byte layout is in `read_header`'s docstring), decides from the dtypes which modules are
quantized and installs them on the meta model, then checks every tensor: truncated data, unknown
dtypes, FP8 tensors under unknown names or for parameters kept in high precision, missing scales,
scale shapes (ceil of the blocks), missing / unexpected / wrongly shaped tensors: all reported
together in one `WeightsError`, every name listed, names that differ only in layer / expert
indices merged into one line. Only then is memory allocated, and `copy_weights` copies one tensor at a time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from tqdm import tqdm

from v4serve.config import ModelConfig
from v4serve.model.official_names import Target, official_target
from v4serve.model.safetensors_files import Entry, WeightsError, checkpoint_files, read_header

_MTP_SHARED = re.compile(r"^(model\.)?mtp\.\d+\.(embed|head|embed_tokens|lm_head)\.weight$")  # the main model's
# The MTP layers' tensors are skipped unless the model was built with them (speculative decoding).
_IGNORED = re.compile(r"^(model\.)?mtp\.")
# A whole dotted component of digits in a tensor name: a layer or an expert index.
_INDEX = re.compile(r"(?<=\.)\d+(?=\.)")
# Checkpoint dtypes by role.
_PLAIN = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "BOOL"}
_FP8 = "F8_E4M3"
_PACKED_FP4 = {"I8", "U8", "F4"}  # packed e2m1 pairs, however the writer typed the bytes
_SCALE_DTYPES = {"F8_E8M0", "F32"}  # FP8 block scales: ue8m0 or fp32
_MX_SCALE_DTYPES = {"F8_E8M0", "U8"}
_SCALE_PARAM = "_scale_inv"  # our scale parameter = weight parameter name + this
_SECTION_ORDER = (
    "truncated tensors (the shard ends before their data)",
    "tensors of an unknown dtype",
    "FP8 tensors under names v4serve does not know",
    "FP8 tensors for parameters v4serve keeps in high precision",
    "FP8 routed experts (not supported yet: expert_dtype fp4 or bf16)",
    "routed experts not in the layer's MXFP4 format",
    "plain tensors where the model holds quantized ones",
    "missing scales (a quantized weight without its scale)",
    "scales with the wrong shape",
    "scales of weights that are not quantized",
    "missing tensors",
    "unexpected tensors",
    "tensors with the wrong shape",
)


def scale_base(key: str) -> str | None:
    """The weight key a scale key belongs to: official `X.scale` -> `X.weight`; transformers'
    `X.weight_scale_inv` -> `X.weight`, `...experts.gate_up_proj_scale_inv` -> `...gate_up_proj`."""
    if key.endswith(".scale"):
        return key[: -len("scale")] + "weight"
    if key.endswith("_scale_inv"):
        return key[: -len("_scale_inv")]
    return None


@dataclass
class Job:
    """One copy: checkpoint `entry` into `target`; `kind` says how (plain, fp8, packed, scale,
    mx_scale, dequantize: FP8 weight + its `scale` entry into a model-dtype weight)."""

    entry: Entry
    target: Target
    kind: str
    scale: Entry | None = None
    block: tuple[int, int] | None = None  # dequantize: the FP8 block
    shard: Any = None  # parallel/shard.py ShardSpec: only this rank's part is read


@dataclass
class CheckpointScan:
    """Everything the headers say, checked against the (meta) model with its quantized modules
    installed; `jobs` are the copies to run."""

    jobs: list[Job]
    total_bytes: int


def _module_of(param: str) -> str:
    return param.rpartition(".")[0]


def scan_checkpoint(net: torch.nn.Module, path: Path, config: ModelConfig, install, shard=None) -> CheckpointScan:
    """Read every shard header, decide the quantized modules from the tensors' dtypes, `install`
    them (a callback taking a QuantPlan) on the meta model, and check every tensor. Any problem:
    ONE WeightsError naming every bad tensor, before anything is allocated.

    `shard(net)` (`parallel/shard.py`), run after `install`, cuts the model to one tensor-parallel
    rank's part and returns its ShardSpecs by parameter name: a cut target's checkpoint tensor is
    checked against the FULL shape (`full_shape`, of the target's expert / rows); tensors of other
    ranks' experts (expert parallel) get no job and are not missing."""
    from v4serve.model.quantized_install import DEQUANTIZE_AT_LOAD, EXPERTS, QuantPlan, fp8_kind, layer_suffix

    files = checkpoint_files(path)
    entries, file_problems = [], []
    for file in files:
        found, problem = read_header(file)
        entries += found
        if problem:
            file_problems.append(problem)
    by_key = {e.key: e for e in entries}
    params = dict(net.named_parameters()) | dict(net.named_buffers())
    problems: dict[str, list[str]] = {}

    def bad(what: str, line: str) -> None:
        problems.setdefault(what, []).append(line)

    # 1. Weights (every key that is not a scale): targets and roles from names and dtypes.
    weights: list[tuple[Entry, Target]] = []
    scales: list[tuple[Entry, str]] = []
    plan = QuantPlan()
    with_mtp = any(name.startswith("mtp.") for name in params)  # else the checkpoint's MTP tensors are skipped
    for e in entries:
        if _IGNORED.match(e.key) and (not with_mtp or _MTP_SHARED.match(e.key)):
            continue
        if e.truncated:
            bad("truncated tensors (the shard ends before their data)", f"{e.key} in {e.file.name}")
        target = Target(e.key) if e.key in params else official_target(e.key, config)
        if target is None or target.name not in params:
            base = scale_base(e.key)
            if base is not None and base in by_key:
                scales.append((e, base))
            elif e.dtype == _FP8:
                bad("FP8 tensors under names v4serve does not know", e.key)
            else:
                bad("unexpected tensors", e.key)
            continue
        module = _module_of(target.name)
        suffix = layer_suffix(module)
        if e.dtype == _FP8:
            if fp8_kind(suffix, config):
                plan.fp8.add(module)
            elif suffix in DEQUANTIZE_AT_LOAD:
                plan.dequantize.add(module)
            elif suffix == EXPERTS:
                bad("FP8 routed experts (not supported yet: expert_dtype fp4 or bf16)", e.key)
                continue
            else:
                bad("FP8 tensors for parameters v4serve keeps in high precision", e.key)
                continue
        elif e.dtype in _PACKED_FP4 and suffix == EXPERTS:
            plan.mxfp4.add(module)
        elif e.dtype not in _PLAIN:
            bad("tensors of an unknown dtype", f"{e.key} ({e.dtype})")
            continue
        weights.append((e, target))
    if (plan.fp8 or plan.dequantize) and config.quantization is None:
        raise WeightsError(
            f"checkpoint {path} holds FP8 tensors but its config.json has no `quantization_config` (the block "
            "size is unknown); pass quantization='fp8' to assume the official 128x128 blocks"
        )
    install(plan)
    shards = shard(net) if shard is not None else {}
    params = dict(net.named_parameters()) | dict(net.named_buffers())

    # 2. Shapes and dtypes against the installed modules; scales to their weights.
    jobs: list[Job] = []
    loaded: dict[str, set] = {name: set() for name in params}
    scale_of = {base: e for e, base in scales}
    block = config.quantization.weight_block_size if config.quantization else None
    for e, target in weights:
        spec = shards.get(target.name)
        if spec is not None and target.expert is not None and spec.dim == 0 and target.expert not in spec.keep:
            scale_of.pop(e.key, None)
            continue  # another rank's expert
        dest = _dest(params[target.name], target) if spec is None else _full(spec, target)
        module = _module_of(target.name)
        if module in plan.dequantize:
            kind = "dequantize"
        elif e.dtype == _FP8:
            kind = "fp8"
        elif module in plan.mxfp4 and target.name.endswith(("gate_up_proj", "down_proj")):
            kind = "packed"
            if e.dtype not in _PACKED_FP4:
                bad("routed experts not in the layer's MXFP4 format", f"{e.key} ({e.dtype})")
                continue
        else:
            kind = "plain"
            if dest.dtype in (torch.float8_e4m3fn, torch.uint8):
                bad("plain tensors where the model holds quantized ones", f"{e.key} ({e.dtype})")
                continue
        if tuple(e.shape) != tuple(dest.shape):
            bad("tensors with the wrong shape", f"{e.key}: checkpoint {tuple(e.shape)}, model {tuple(dest.shape)}")
            continue
        scale = scale_of.pop(e.key, None)
        if kind in ("fp8", "dequantize", "packed"):
            if scale is None:
                bad("missing scales (a quantized weight without its scale)", e.key)
                continue
            if kind == "packed":
                want, dtypes = dest.shape[:-1] + (dest.shape[-1] * 2 // 32,), _MX_SCALE_DTYPES
            else:
                want, dtypes = tuple(-(-n // b) for n, b in zip(e.shape, block)), _SCALE_DTYPES
            if tuple(scale.shape) != tuple(want):
                bad("scales with the wrong shape", f"{scale.key}: checkpoint {tuple(scale.shape)}, expected "
                    f"{tuple(want)} for {e.key} {tuple(e.shape)}"
                    + ("" if kind == "packed" else f" (ceil of blocks {tuple(block)})"))
                continue
            if scale.dtype not in dtypes:
                bad("tensors of an unknown dtype", f"{scale.key} ({scale.dtype})")
                continue
            if kind != "dequantize":
                scale_target = Target(target.name + _SCALE_PARAM, target.expert, target.rows)
                jobs.append(Job(scale, scale_target, "mx_scale" if kind == "packed" else "scale",
                                shard=shards.get(scale_target.name)))
                _mark(loaded, scale_target)
        elif scale is not None:
            bad("scales of weights that are not quantized", scale.key)
        jobs.append(Job(e, target, kind, *((scale, block) if kind == "dequantize" else ()), shard=spec))
        _mark(loaded, target)
    for e in scale_of.values():  # scales of weights not rejected above (those are reported already)
        base = scale_base(e.key)
        if not any(line.split(" ")[0].rstrip(":") == base for lines in problems.values() for line in lines):
            bad("scales of weights that are not quantized", e.key)
    missing = [name for name, parts in loaded.items() if not _complete(name, parts, config, shards.get(name))]
    if missing:
        problems["missing tensors"] = missing
    if problems or file_problems:
        lines = [f"unreadable shards ({len(file_problems)}):" + "".join(f"\n    {p}" for p in file_problems)] \
            if file_problems else []
        lines += [
            f"{what} ({len(names)}):" + "".join(f"\n    {line}" for line in compact_names(names))
            for what, names in sorted(problems.items(), key=lambda item: _SECTION_ORDER.index(item[0]))
        ]
        raise WeightsError(f"checkpoint {path} does not match the model config:\n  " + "\n  ".join(lines))
    return CheckpointScan(jobs, sum(j.entry.nbytes + (j.scale.nbytes if j.scale else 0) for j in jobs))


def _dest(param: torch.Tensor, target: Target) -> torch.Tensor:
    dest = param
    if target.expert is not None:
        dest = dest[target.expert]
    if target.rows is not None:
        dest = dest[target.rows]
    return dest


def _full(spec, target: Target) -> torch.Tensor:
    """A meta tensor of the shape the checkpoint holds for `target` of a cut parameter (`spec`)."""
    full = torch.empty(spec.full_shape, device="meta")
    return _dest(full, target)


def _mark(loaded: dict[str, set], target: Target) -> None:
    loaded[target.name].add((target.expert, None if target.rows is None else target.rows.start))


def _complete(name: str, parts: set, config: ModelConfig, spec=None) -> bool:
    """Whole tensors are complete once loaded; fused expert tensors need every expert (and both
    halves): with expert parallelism (`spec` cutting experts), every expert of this rank."""
    if not parts:
        return False
    if (None, None) in parts:
        return True
    halves = 2 if name.endswith(("gate_up_proj", "gate_up_proj" + _SCALE_PARAM)) else 1
    experts = len(spec.keep) if spec is not None and spec.dim == 0 else config.n_routed_experts
    return len(parts) == experts * halves


@torch.no_grad()
def copy_weights(scan: CheckpointScan, write, device: torch.device, progress: bool = True,
                 params: dict[str, torch.Tensor] | None = None) -> None:
    """Run the copies one tensor at a time from the memory-mapped shards (safe_open): each tensor
    is read, put in its stored form (e4m3 codes, fp32 block scales, packed bytes, or for
    `dequantize` jobs the model dtype, computed on `device`) and handed to `write(target, value)`,
    which copies it straight to its place (device, or pinned host memory for offloaded experts).
    A progress bar in GB and GB/s. A job of a cut parameter (`job.shard`, tensor parallel) reads
    only this rank's part (`ShardSpec.read` on safe_open's `get_slice`) into its place in
    `params[job.target.name]` (the materialised parameters by name)."""
    from v4serve.ops.weight_formats import decode_ue8m0, dequantize_fp8_blocks

    handles: dict[Path, Any] = {}

    def handle(entry: Entry):
        if entry.file not in handles:
            handles[entry.file] = safe_open(str(entry.file), framework="pt")
        return handles[entry.file]

    def fp32_scale(s: torch.Tensor) -> torch.Tensor:
        return decode_ue8m0(s) if s.dtype in (torch.float8_e8m0fnu, torch.uint8) else s.float()

    def stored(t: torch.Tensor, kind: str) -> torch.Tensor:
        if kind == "fp8":
            return t.view(torch.float8_e4m3fn)
        if kind in ("packed", "mx_scale"):
            return t.view(torch.uint8)
        if kind == "scale":
            return fp32_scale(t)
        return t

    with tqdm(total=scan.total_bytes, desc="Loading weights", unit="B", unit_scale=True, unit_divisor=1000,
              disable=not progress) as bar:
        for job in scan.jobs:
            done = job.entry.nbytes + (job.scale.nbytes if job.scale else 0)
            if job.shard is not None:
                dest = params[job.target.name]
                if job.kind == "dequantize":  # this rank's rows of the dequantized weight
                    t = job.shard.read_dequantized(handle(job.entry).get_slice(job.entry.key),
                                                   handle(job.scale).get_slice(job.scale.key), job.block,
                                                   lambda s: fp32_scale(s).to(device), device)
                else:
                    placed = job.shard.read(handle(job.entry).get_slice(job.entry.key), dest,
                                            job.target.expert, job.target.rows)
                    assert placed is not None, job.entry.key  # other ranks' experts have no job
                    dest, t = placed
                    t = stored(t, job.kind)
                dest.copy_(t.to(dest.dtype))
                bar.update(done)
                continue
            t = handle(job.entry).get_tensor(job.entry.key)
            if job.kind == "dequantize":
                s = fp32_scale(handle(job.scale).get_tensor(job.scale.key)).to(device)
                t = dequantize_fp8_blocks(t.to(device), s, job.block)
            else:
                t = stored(t, job.kind)
            write(job.target, t)
            bar.update(done)


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
