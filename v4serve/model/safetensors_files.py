"""Safetensors checkpoint files read without loading them: the shard list (single file or an index)
and each shard's header (`read_header`: the byte layout in its docstring)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


class WeightsError(ValueError):
    """The checkpoint does not match the model: every problem is listed."""


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


@dataclass(frozen=True)
class Entry:
    """One tensor of a shard, from the header alone (nothing is read)."""

    key: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    truncated: bool  # the shard ends before this tensor's data does


def read_header(file: Path) -> tuple[list[Entry], str | None]:
    """A safetensors header: bytes 0..7 = little-endian u64 n; bytes 8..8+n = JSON
    {key: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}; the data of a
    tensor lies at 8 + n + begin .. 8 + n + end. Returns the entries and a problem with the file
    itself (None when the header is whole)."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return [], f"{file.name}: {size} bytes, shorter than a safetensors header"
        n = int.from_bytes(head, "little")
        if 8 + n > size:
            return [], f"{file.name}: the header ({n} bytes) runs past the end of the file ({size} bytes)"
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return [], f"{file.name}: unreadable header ({e})"
    entries = []
    for key, info in header.items():
        if key == "__metadata__":
            continue
        begin, stop = info["data_offsets"]
        shape = tuple(info["shape"])
        if info["dtype"] == "F4" and shape:  # 4-bit elements in the header; we count the packed bytes
            shape = (*shape[:-1], shape[-1] // 2)
        entries.append(Entry(key, file, info["dtype"], shape, stop - begin, 8 + n + stop > size))
    return entries, None
