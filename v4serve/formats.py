"""KV row formats: how one cache row of `dim` channels is stored.

Every format is a quantize -> dequantize round trip of the DeepSeek-V4 reference (see
v4serve/ops/kv_quant_reference.py for the exact rounding); `row_bytes` is the packed size a pool
row needs. `bf16` stores the model's own values unchanged.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class RowFormat:
    name: str
    value_bits: int  # bits per quantized channel (16 = stored as is)
    block: int  # channels per scale (0 = no scale)
    plain_tail: int  # trailing channels kept in bf16 (the RoPE part of V4 KV rows)
    row_align: int  # packed row size is padded to this many bytes
    used_for: str

    def row_bytes(self, dim: int) -> int:
        quantized = dim - self.plain_tail
        if quantized < 0 or (self.block and quantized % self.block):
            raise ValueError(f"format {self.name} cannot hold a row of {dim} channels")
        scales = quantized // self.block if self.block else 0
        raw = quantized * self.value_bits // 8 + 2 * self.plain_tail + scales
        return -(-raw // self.row_align) * self.row_align


ROW_FORMATS = {
    f.name: f
    for f in (
        RowFormat("bf16", 16, 0, 0, 1, "any row, stored as computed"),
        RowFormat("fp8_e8m0_b64_rope64", 8, 64, 64, 8, "V4 window and main compressed KV (448 e4m3 + 64 bf16 rope)"),
        RowFormat("fp8_e8m0_b32", 8, 32, 0, 1, "V4.1 window KV"),
        RowFormat("fp4_e8m0_b32", 4, 32, 0, 1, "V4 / V4.1 indexer q and k, after the Hadamard rotation"),
        RowFormat("fp4_e4m3_b16", 4, 16, 0, 1, "V4.1 main compressed KV"),
    )
}


def row_format(name: str) -> RowFormat:
    if name not in ROW_FORMATS:
        raise ValueError(f"unknown row format {name!r}; known: {sorted(ROW_FORMATS)}")
    return ROW_FORMATS[name]


@dataclass(frozen=True)
class CacheFormat:
    """What a KV cache stores (`kv_cache_dtype`, vLLM's name): the row format of window and
    compressed KV rows, and the one indexer keys (and queries) are rounded through after a Hadamard
    rotation. `bf16` keeps every row as the model computes it (in the model's dtype: fp32 on the
    CPU), which is what transformers computes."""

    name: str
    kv_rows: str
    index_rows: str

    @property
    def quantized(self) -> bool:
        return self.kv_rows != "bf16" or self.index_rows != "bf16"


CACHE_FORMATS = {
    f.name: f
    for f in (
        # Unquantized rows: what transformers computes.
        CacheFormat("bf16", "bf16", "bf16"),
        # The model's native formats (the official DeepSeek-V4 numerics): fp8 KV with ue8m0 scales
        # per 64 (rope tail in bf16), indexer q and keys rotated by a Hadamard transform and
        # rounded to fp4 with ue8m0 per 32.
        CacheFormat("auto", "fp8_e8m0_b64_rope64", "fp4_e8m0_b32"),
    )
}
# Old names of `kv_cache_dtype` values (the `kv_format` argument's).
_DEPRECATED_NAMES = {"reference": "auto"}


def default_kv_cache_dtype(device_type: str) -> str:
    """"auto" (the native packed formats) on CUDA, "bf16" on the CPU, where parity tests run."""
    return "auto" if device_type == "cuda" else "bf16"


def cache_format(name: str | None, device_type: str = "cpu") -> CacheFormat:
    """The `kv_cache_dtype` named `name` (None: the device's default); "reference" is the old
    spelling of "auto" (a DeprecationWarning says so)."""
    if name is None:
        name = default_kv_cache_dtype(device_type)
    if name in _DEPRECATED_NAMES:
        import warnings

        new = _DEPRECATED_NAMES[name]
        warnings.warn(f"kv_cache_dtype {name!r} is deprecated; use {new!r}", DeprecationWarning, stacklevel=3)
        name = new
    if name not in CACHE_FORMATS:
        raise ValueError(f"kv_cache_dtype {name!r} is not one of {sorted(CACHE_FORMATS)}")
    return CACHE_FORMATS[name]
