"""A GGUF file's header: its metadata key-value pairs, read without loading a tensor (GGUF v2/v3, little-endian).

What a GGUF says about itself (`general.architecture`, `general.name`, `general.file_type`, the chat template) is
what a source built from other people's files can be checked against: `read_header(path)` returns the scalar and
string values; arrays are summarized as their element type and length (the tokenizer's 150k tokens are not kept).
A file that is not a GGUF, or whose header is cut short, is a one-line ArtifactError.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

from artifact.errors import ArtifactError

MAGIC = b"GGUF"
# GGUF value types -> struct format (scalars); 8 = string, 9 = array
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
TYPE_NAMES = {
    0: "uint8",
    1: "int8",
    2: "uint16",
    3: "int16",
    4: "uint32",
    5: "int32",
    6: "float32",
    7: "bool",
    8: "string",
    9: "array",
    10: "uint64",
    11: "int64",
    12: "float64",
}
# llama.cpp's llama_ftype (general.file_type) for the types this artifact meets
FILE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    32: "BF16",
}
MAX_STRING = 1 << 24  # a metadata string longer than 16 MiB is taken for a corrupt header


class _Reader:
    def __init__(self, fh: BinaryIO, path: Path):
        self.fh, self.path = fh, path

    def take(self, fmt: str):
        n = struct.calcsize(fmt)
        data = self.fh.read(n)
        if len(data) != n:
            raise ArtifactError(f"{self.path}: GGUF header cut short (the file is truncated or not a GGUF)")
        return struct.unpack(fmt, data)[0]

    def string(self) -> str:
        n = self.take("<Q")
        if n > MAX_STRING:
            raise ArtifactError(f"{self.path}: GGUF header has a {n}-byte string (corrupt header)")
        data = self.fh.read(n)
        if len(data) != n:
            raise ArtifactError(f"{self.path}: GGUF header cut short (the file is truncated or not a GGUF)")
        return data.decode("utf-8", errors="replace")

    def value(self, vtype: int):
        if vtype in SCALARS:
            return self.take(SCALARS[vtype])
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:  # summarized: element type and length
            etype, n = self.take("<I"), self.take("<Q")
            if etype == STRING:
                for _ in range(n):
                    self.fh.seek(self.take("<Q"), 1)
            elif etype in SCALARS:
                self.fh.seek(struct.calcsize(SCALARS[etype]) * n, 1)
            else:
                raise ArtifactError(f"{self.path}: GGUF array of unknown type {etype} (corrupt header)")
            return {"array": TYPE_NAMES[etype], "length": n}
        raise ArtifactError(f"{self.path}: GGUF value of unknown type {vtype} (corrupt header)")


def read_header(path: Path) -> dict:
    """{"version", "tensor_count", "metadata": {key: value}} of a GGUF file (arrays as {"array", "length"})."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            if fh.read(4) != MAGIC:
                raise ArtifactError(f"{path}: not a GGUF file (no 'GGUF' magic)")
            r = _Reader(fh, path)
            version = r.take("<I")
            if version not in (2, 3):
                raise ArtifactError(f"{path}: GGUF version {version} (this reader knows 2 and 3)")
            tensors, kvs = r.take("<Q"), r.take("<Q")
            meta = {}
            for _ in range(kvs):
                key = r.string()
                meta[key] = r.value(r.take("<I"))
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return {"version": version, "tensor_count": tensors, "metadata": meta}


def summary(header: dict) -> dict:
    """The facts a configuration or a manifest records: architecture, name, file type, sizes, chat template."""
    m = header["metadata"]
    arch = m.get("general.architecture", "")
    ftype = m.get("general.file_type")
    return {
        "gguf_version": header["version"],
        "tensor_count": header["tensor_count"],
        "architecture": arch,
        "name": m.get("general.name", ""),
        "file_type": ftype,
        "file_type_name": FILE_TYPES.get(ftype, "") if isinstance(ftype, int) else "",
        "block_count": m.get(f"{arch}.block_count"),
        "embedding_length": m.get(f"{arch}.embedding_length"),
        "context_length": m.get(f"{arch}.context_length"),
        "vocab_size": (m.get("tokenizer.ggml.tokens") or {}).get("length"),
        "chat_template": m.get("tokenizer.chat_template", ""),
    }
