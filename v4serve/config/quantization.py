"""How the checkpoint stores its weights: QuantConfig (config.json's `quantization_config` and
`expert_dtype`) and the `quantization=` override of `LLM` / the CLI over it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from v4serve.config.fields import ConfigError, positive_field

if TYPE_CHECKING:
    from v4serve.config.model_config import ModelConfig

QUANT_FIELDS = ("quantization_config", "expert_dtype")
EXPERT_DTYPES = ("fp4", "fp8", "bf16")
# `quantization=` values (vLLM's argument name): None = what config.json says.
QUANTIZATION_CHOICES = ("fp8", "fp8-reference", "none")


@dataclass(frozen=True)
class QuantConfig:
    """How the checkpoint stores its weights (`quantization_config` + `expert_dtype` of config.json).

    Dense linears: e4m3 codes `[N, K]` with one scale per `weight_block_size` = (bn, bk) block,
    scale shape `[ceil(N/bn), ceil(K/bk)]`; `scale_fmt` "ue8m0" (power-of-two scales stored as
    F8_E8M0) or None (fp32 scales). Routed experts: `expert_dtype` "fp4" = OCP MXFP4 (packed e2m1
    pairs + ue8m0 per 32 along K), "bf16" = unquantized, "fp8" = block FP8 like the dense ones.
    `act_block`: None = weight-only numerics (activations stay in the model dtype); an int = the
    official numerics, activations quantized to e4m3 per `act_block` channels before each FP8 GEMM
    (only ever set explicitly: `quantization="fp8-reference"`)."""

    method: str = "fp8"
    fmt: str = "e4m3"
    scale_fmt: str | None = "ue8m0"
    weight_block_size: tuple[int, int] = (128, 128)
    expert_dtype: str = "fp4"
    act_block: int | None = None

    def __post_init__(self) -> None:
        if self.method != "fp8":
            raise ConfigError(f"config field `quantization_config.quant_method` = {self.method!r}; only 'fp8' is supported")
        if self.fmt != "e4m3":
            raise ConfigError(f"config field `quantization_config.fmt` = {self.fmt!r}; only 'e4m3' is supported")
        if self.scale_fmt not in ("ue8m0", None):
            raise ConfigError(f"config field `quantization_config.scale_fmt` = {self.scale_fmt!r}; "
                              "expected 'ue8m0' or absent (fp32 scales)")
        if len(self.weight_block_size) != 2:
            raise ConfigError(f"config field `quantization_config.weight_block_size` must be [bn, bk], "
                              f"got {list(self.weight_block_size)!r}")
        for i, b in enumerate(self.weight_block_size):
            positive_field(b, f"quantization_config.weight_block_size[{i}]", int)
        if self.expert_dtype not in EXPERT_DTYPES:
            raise ConfigError(f"config field `expert_dtype` = {self.expert_dtype!r} is not one of {EXPERT_DTYPES}")
        if self.act_block is not None:
            positive_field(self.act_block, "act_block", int)

    @classmethod
    def from_raw(cls, raw: dict[str, Any], flat_block: tuple[int, int] = (128, 128)) -> "QuantConfig | None":
        """From config.json: `quantization_config` (official or transformers' spelling; transformers
        moves `expert_dtype` inside it), top-level `expert_dtype`; or the official flat
        inference/config.json's `dtype: fp8`, whose blocks the model defines (`flat_block`: 128 x 128
        for V4, 32 x 32 for V4.1). None when the weights are plain."""
        q = raw.get("quantization_config")
        expert = raw.get("expert_dtype")
        if q is None and raw.get("dtype") == "fp8":  # the official flat inference/config.json
            q = {"scale_fmt": raw.get("scale_fmt", "ue8m0"), "weight_block_size": raw.get("weight_block_size", list(flat_block))}
        if q is None:
            if expert not in (None, "bf16"):
                raise ConfigError(f"config field `expert_dtype` = {expert!r} needs a `quantization_config`")
            return None
        if not isinstance(q, dict):
            raise ConfigError(f"config field `quantization_config` must be an object, got {q!r}")
        block = q.get("weight_block_size", [128, 128])
        if not isinstance(block, (list, tuple)):
            raise ConfigError(f"config field `quantization_config.weight_block_size` must be [bn, bk], got {block!r}")
        return cls(
            method=q.get("quant_method", "fp8"), fmt=q.get("fmt", "e4m3"), scale_fmt=q.get("scale_fmt"),
            weight_block_size=tuple(block), expert_dtype=q.get("expert_dtype", expert) or "bf16",
        )

    @classmethod
    def official(cls) -> "QuantConfig":
        """DeepSeek-V4 / V4-Pro as released: FP8 e4m3 dense with ue8m0 128x128 blocks, MXFP4 experts."""
        return cls()

    def to_hf_dict(self) -> dict[str, Any]:
        q = {"quant_method": self.method, "fmt": self.fmt, "weight_block_size": list(self.weight_block_size)}
        if self.scale_fmt is not None:
            q["scale_fmt"] = self.scale_fmt
        return {"quantization_config": q, "expert_dtype": self.expert_dtype}


def apply_quantization_override(config: "ModelConfig", quantization: str | None) -> "ModelConfig":
    """`LLM(quantization=...)` over config.json: None keeps it; "fp8" = config.json's scheme (the
    official one where config.json has none); "fp8-reference" = that with the official activation
    quantization (e4m3 per block of K before every FP8 GEMM); "none" = plain weights (presets)."""
    if quantization is None:
        return config
    if quantization not in QUANTIZATION_CHOICES:
        raise ConfigError(f"quantization {quantization!r} is not one of {QUANTIZATION_CHOICES} (or None: config.json)")
    if quantization == "none":
        return config.replace(quantization=None)
    q = config.quantization or QuantConfig.official()
    act = q.weight_block_size[1] if quantization == "fp8-reference" else None
    return config.replace(quantization=dataclasses.replace(q, act_block=act))
