"""The engine's command-line flags, derived from `EngineArgs` so that `generate` and `serve`
cannot drift from it or from each other.

Every field of `EngineArgs` becomes a flag (`max_num_seqs` -> `--max-num-seqs`) with the
field's default, a type read from its annotation, and as help the comment on the field's line
in the dataclass (or `HELP` below); `CHOICES` / `TYPES` add what an annotation cannot say.
A field added to `EngineArgs` gets its flag without an edit here; a field whose annotation maps
to no flag type fails at parser build (and in tests/test_cli.py), not silently.

    bool                    --flag / --no-flag
    int, float, str (| None) type=int / float / str
    tuple[int, ...] | None  nargs="+" of int, passed on as a tuple
    dict | None             a JSON object
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
import typing
from typing import Any

from v4serve.cache.budget import parse_size
from v4serve.config import QUANTIZATION_CHOICES
from v4serve.engine.offload import parse_cpu_offload_gb
from v4serve.engine.args import EngineArgs

NOT_FLAGS = {"progress"}  # set by the command (a progress bar suits `generate`, not a server log)
DEFAULT_MODEL = "tiny"
CHOICES = {
    "device": ["cpu", "cuda"],
    "dtype": ["float32", "bfloat16", "float16"],
    "kernels": ["auto", "torch", "triton"],
    "kv_cache_dtype": ["auto", "bf16"],
    "quantization": list(QUANTIZATION_CHOICES),
}
TYPES = {"kv_cache_memory": parse_size, "cpu_offload_gb": parse_cpu_offload_gb}  # "2GiB"; a number or "auto"
HELP = {
    "model": "preset name (tiny, deepseek-v4-flash, deepseek-v4-pro, deepseek-v4.1-flash) or checkpoint folder",
    "seed": "seed of the random numbers of requests that set no seed of their own",
    "hf_overrides": 'JSON object of config.json fields to override, e.g. \'{"num_hidden_layers": 8}\'',
    "kv_cache_memory": "bytes for the KV cache (all tiers), e.g. 2GiB, solved into pages "
                       "(None: free GPU memory on cuda, full length on cpu)",
    "gpu_memory_utilization": "share of the GPU's total memory this engine may use, weights, KV cache and "
                              "activations, e.g. 0.9 (vLLM's; default: all of its free memory); --kv-cache-memory "
                              "or --num-kv-pages, when given, size the KV cache instead",
    "max_num_seqs": "most sequences running at once (the decode batch)",
    "max_num_batched_tokens": "most tokens computed per step (the prefill chunk budget)",
    "cuda_graph_sizes": "decode batch sizes captured as CUDA graphs (None: 1 2 4 ... max-num-seqs)",
    "quantization": "override config.json's weight format: fp8 (weight-only numerics), fp8-reference (with the "
                    "official e4m3 activation quantization), none (plain weights; presets)",
    "cpu_offload_gb": "GiB of routed experts kept in pinned host memory and fetched per step into a device expert "
                      "cache, or 'auto' (fill the GPU first, keep the KV budget, offload the rest)",
    "speculative_config": 'JSON object, e.g. \'{"method": "mtp", "num_speculative_tokens": 3}\': the checkpoint\'s MTP '
                          'layer drafts k tokens a step, one target step verifies them ("draft_head": "auto", the '
                          'default, drafts with an FP8 copy of the lm head on CUDA; "shared" with the lm head)',
}


def flag_fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(EngineArgs) if f.name not in NOT_FLAGS]


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """One flag per `EngineArgs` field (`--model` defaults to the tiny preset)."""
    hints = typing.get_type_hints(EngineArgs)
    comments = _field_comments()
    group = parser.add_argument_group("engine (EngineArgs)")
    for f in flag_fields():
        default = DEFAULT_MODEL if f.name == "model" else f.default
        help_text = HELP.get(f.name) or comments.get(f.name) or f"EngineArgs.{f.name}"
        kwargs: dict[str, Any] = {"default": default, "help": help_text.replace("%", "%%"), "dest": f.name}
        kwargs.update(_type_kwargs(f.name, hints[f.name]))
        group.add_argument("--" + f.name.replace("_", "-"), **kwargs)
    # vLLM command lines for DeepSeek checkpoints carry it; there is no checkpoint code to trust here.
    group.add_argument("--trust-remote-code", action="store_true",
                       help="accepted for vLLM command lines: v4serve runs no code from a checkpoint (the model "
                            "is built in), so it changes nothing")


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The `EngineArgs` keyword arguments the parsed flags give (every field but `NOT_FLAGS`)."""
    out = {}
    for f in flag_fields():
        value = getattr(args, f.name)
        out[f.name] = tuple(value) if isinstance(value, list) else value
    return out


def _type_kwargs(name: str, hint: Any) -> dict[str, Any]:
    if name in CHOICES:
        return {"choices": CHOICES[name], "type": str}
    if name in TYPES:
        return {"type": TYPES[name]}
    args = [a for a in typing.get_args(hint) if a is not type(None)] if _is_union(hint) else [hint]
    if bool in args:
        return {"action": argparse.BooleanOptionalAction}
    for kind in (int, float):
        if args == [kind]:
            return {"type": kind}
    if str in args:
        return {"type": str}
    for a in args:
        origin = typing.get_origin(a)
        if origin is tuple and typing.get_args(a)[:1] == (int,):
            return {"type": int, "nargs": "+", "metavar": "N"}
        if origin is dict or a is dict:
            return {"type": json.loads, "metavar": "JSON"}
    raise TypeError(f"EngineArgs.{name}: no command-line type for {hint!r}; add it to v4serve/engine_flags.py")


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, getattr(__import__("types"), "UnionType", None))


def _field_comments() -> dict[str, str]:
    """`name: type = default  # comment` lines of the EngineArgs class body."""
    try:
        source = inspect.getsource(EngineArgs)
    except (OSError, TypeError):  # no source (a frozen build): the field names serve as help
        return {}
    found = {}
    for line in source.splitlines():
        m = re.match(r"\s+(\w+)\s*:[^#]*#\s*(.+)$", line)
        if m:  # "default: X" would read oddly beside argparse's "(default: None)"
            found[m.group(1)] = re.sub(r"^default: ", "None: ", m.group(2).strip())
    return found
