"""KV row formats: how one cache row of `dim` channels is stored, value by value and byte by byte.

Every format is a quantize -> dequantize round trip of the DeepSeek-V4 reference (see
v4serve/ops/kv_quant_reference.py for the exact rounding); `bf16` stores the model's own values.
A packed row (v4serve/ops/kv_pack*.py) holds, in this order, with Q = dim - plain_tail
quantized channels and Q / block scales:

    [codes_offset, +codes_bytes)    the Q codes: e4m3 one byte each; e2m1 two per byte (element
                                    2i in the low nibble, 2i+1 in the high one; bit 3 = sign)
    [tail_offset,  +tail_bytes)     the plain_tail trailing channels (RoPE) as bf16, little-endian
    [scales_offset, +n_scales)      one scale byte per block: ue8m0 = the biased exponent b of the
                                    power of two 2^(b - 127); e4m3 = an fp8 e4m3fn value
    [payload_bytes, row_bytes)      zero padding up to a multiple of row_align

| format               | dim | codes      | tail       | scales     | payload | row  | align |
| fp8_e8m0_b64_rope64  | 512 | [0, 448)   | [448, 576) | [576, 583) | 583     | 592  | 16    |
| fp8_e8m0_b32         | 512 | [0, 512)   | -          | [512, 528) | 528     | 528  | 16    |
| fp4_e8m0_b32         | 128 | [0, 64)    | -          | [64, 68)   | 68      | 68   | 4     |
| fp4_e4m3_b16         | 512 | [0, 256)   | -          | [256, 288) | 288     | 288  | 16    |

Row strides. The main / window rows are padded to 592 B (the official model's rows are 584 B:
the 583-byte payload padded to 8) so that every row of a pool starts 16-byte aligned and the
attention kernels gather it with 16-byte loads. Index keys keep 68 B = 17 int32 words (4-byte
aligned): the indexer kernel reads them as words. `bf16` rows are 2 * dim bytes.
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
    scale_kind: str | None = None  # "ue8m0" (power of two), "e4m3", or None (no scale)

    @property
    def packed(self) -> bool:
        """Rows are stored as bytes (codes + scales), not as the values themselves."""
        return self.scale_kind is not None

    def n_quant(self, dim: int) -> int:
        """Quantized channels of a row of `dim` (validated)."""
        quantized = dim - self.plain_tail
        if quantized < 0 or (self.block and quantized % self.block) or (self.value_bits == 4 and quantized % 2):
            raise ValueError(f"format {self.name} cannot hold a row of {dim} channels")
        return quantized

    def codes_offset(self, dim: int) -> int:
        return 0

    def codes_bytes(self, dim: int) -> int:
        return self.n_quant(dim) * self.value_bits // 8

    def tail_offset(self, dim: int) -> int:
        return self.codes_bytes(dim)

    def tail_bytes(self, dim: int) -> int:
        self.n_quant(dim)
        return 2 * self.plain_tail

    def scales_offset(self, dim: int) -> int:
        return self.tail_offset(dim) + self.tail_bytes(dim)

    def n_scales(self, dim: int) -> int:
        return self.n_quant(dim) // self.block if self.block else 0

    def payload_bytes(self, dim: int) -> int:
        """Bytes that carry data (codes + tail + scales); the row is this padded to row_align."""
        return self.scales_offset(dim) + self.n_scales(dim)

    def row_bytes(self, dim: int) -> int:
        """The pool row stride in bytes for a row of `dim` channels."""
        return -(-self.payload_bytes(dim) // self.row_align) * self.row_align


ROW_FORMATS = {
    f.name: f
    for f in (
        RowFormat("bf16", 16, 0, 0, 1, "any row, stored as computed"),
        RowFormat("fp8_e8m0_b64_rope64", 8, 64, 64, 16,
                  "V4 window and main compressed KV (448 e4m3 + 64 bf16 rope)", "ue8m0"),
        RowFormat("fp8_e8m0_b32", 8, 32, 0, 16, "V4.1 window KV", "ue8m0"),
        RowFormat("fp4_e8m0_b32", 4, 32, 0, 4, "V4 / V4.1 indexer q and k, after the Hadamard rotation", "ue8m0"),
        RowFormat("fp4_e4m3_b16", 4, 16, 0, 16, "V4.1 main compressed KV", "e4m3"),
    )
}


def row_format(name: "str | RowFormat") -> RowFormat:
    """The RowFormat called `name` (a RowFormat is returned as is)."""
    if isinstance(name, RowFormat):
        return name
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
