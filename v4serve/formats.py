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
    """What a KV cache stores: the row format of window and compressed KV rows, and the one
    indexer queries and keys are rounded through after a Hadamard rotation (None: as computed)."""

    name: str
    kv_rows: str
    index_rows: str | None
    compressed_rows: str | None = None  # V4.1: main compressed rows, when not `kv_rows` (None: kv_rows)

    @property
    def compressed_row_format(self) -> str:
        return self.compressed_rows or self.kv_rows


CACHE_FORMATS = {
    f.name: f
    for f in (
        # What transformers computes: rows kept as the model computes them.
        CacheFormat("bf16", "bf16", None),
        # The official DeepSeek-V4 numerics: fp8 KV with ue8m0 scales per 64 (rope tail in bf16),
        # indexer q and keys rotated by a Hadamard transform and rounded to fp4 with ue8m0 per 32.
        CacheFormat("reference", "fp8_e8m0_b64_rope64", "fp4_e8m0_b32"),
        # DeepSeek-V4.1's official numerics: fp8 window rows with ue8m0 per 32 (rope tail included),
        # fp4 compressed rows with e4m3 scales per 16, fp4 index queries / keys (no Hadamard).
        CacheFormat("v41", "fp8_e8m0_b32", "fp4_e8m0_b32", "fp4_e4m3_b16"),
    )
}


def cache_format(name: str | None) -> CacheFormat:
    if name is None:
        return CACHE_FORMATS["bf16"]
    if name not in CACHE_FORMATS:
        raise ValueError(f"kv_format {name!r} is not one of {sorted(CACHE_FORMATS)}")
    return CACHE_FORMATS[name]
