"""What one layer reads and writes of the KV cache: `PagedKVCache.view(layer)`.

A `Pool` is one tier's rows with their `RowFormat`. Packed (`kv_cache_dtype="auto"`) it is
`[N, row_bytes]` uint8, each row the format's bytes (layouts in `v4serve/formats.py`, ops in
`ops/kv_pack.py`), and kernels decode the rows they gather; unpacked (`"bf16"`) it is `[N, dim]`
in the model's dtype, a stored row being the format's round trip of the value. Pools start
16-byte aligned.

A `LayerCache` holds a layer's window pool, its compressed and index-key pools (a V4.1 layer
that reads a source layer's pools gets the source's `Pool` objects here), its compressor and
indexer states, and its plan; the model touches the cache only through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from v4serve.formats import RowFormat
from v4serve.layer_plan import LayerPlan
from v4serve.ops.kv_pack import store_rows, unpack_rows
from v4serve.ops.kv_quant import apply_kv_format


@dataclass(frozen=True)
class Pool:
    data: torch.Tensor  # [N, dim] (model dtype) or [N, row_bytes] uint8 when packed
    row_format: RowFormat
    dim: int  # channels of a row
    packed: bool
    value_dtype: torch.dtype  # dtype of the rows' values (the model's): what `round` returns

    @property
    def num_rows(self) -> int:
        return int(self.data.shape[0])

    @property
    def scratch_row(self) -> int:
        """The last row: where a decode step writes rows nobody will read (`kv_cache.py`)."""
        return self.num_rows - 1

    @property
    def read_format(self) -> RowFormat | None:
        """The row format a kernel reading `data` must decode (None: plain rows)."""
        return self.row_format if self.packed else None

    def round(self, values: torch.Tensor, impl: str = "auto") -> torch.Tensor:
        """The values a row holds after storing `values`, in `value_dtype` (also how a query is
        rounded to the keys' format)."""
        return apply_kv_format(values.to(self.value_dtype), self.row_format.name, impl=impl)

    def store(self, rows: torch.Tensor, values: torch.Tensor, impl: str = "auto") -> None:
        """Write `values` [n, dim] (any float dtype) to pool rows `rows` [n], quantized and packed
        when the pool is packed, else rounded through the format in the pool's dtype."""
        if self.packed:
            store_rows(self.data, rows, values.to(self.value_dtype), self.row_format, impl=impl)
        else:
            self.data[rows] = self.round(values, impl)

    def values(self, rows: slice | torch.Tensor = slice(None)) -> torch.Tensor:
        """The values rows `rows` hold, [n, dim] in `value_dtype` (packed rows decoded)."""
        if self.packed:
            return unpack_rows(self.data[rows], self.row_format, self.dim, self.value_dtype)
        return self.data[rows]

    def copy_rows(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Row-for-row copy inside the pool (the window ring keeps a chunk's last rows)."""
        self.data[dst] = self.data[src]


@dataclass(frozen=True)
class LayerCache:
    plan: LayerPlan
    window: Pool
    compressed: Pool | None
    index_keys: Pool | None
    compressor_state: Any  # kv_cache.CompressorState | OnlinePoolState | None
    indexer_state: Any
