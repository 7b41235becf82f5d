"""An independent safetensors reader and writer, written from the format's specification
(https://github.com/huggingface/safetensors#format), numpy only: the test's view of the format, not
zrt's. A file is u64 little-endian N, N bytes of JSON header, then the byte buffer the header's
data_offsets index; a model above a size limit is several files and <stem>.safetensors.index.json.
"""
import json
import os
import struct

import numpy as np

SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2, "U32": 4, "I32": 4,
         "F32": 4, "U64": 8, "I64": 8, "F64": 8}
NUMPY = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16,
         "F16": np.float16, "U32": np.uint32, "I32": np.int32, "F32": np.float32, "U64": np.uint64,
         "I64": np.int64, "F64": np.float64}


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    """Round to nearest even, as torch and zrt do (NaN kept a NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def read_file(path):
    """(tensors: name -> (dtype, np array as stored), metadata) of one .safetensors file, checked."""
    with open(path, "rb") as f:
        blob = f.read()
    assert len(blob) >= 8, f"{path}: too short"
    (n,) = struct.unpack("<Q", blob[:8])
    assert n <= 100 << 20 and 8 + n <= len(blob), f"{path}: header length {n}"
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    assert (8 + n) % 8 == 0, f"{path}: the buffer does not start 8-byte aligned ({8 + n})"
    buf = blob[8 + n:]
    metadata = header.pop("__metadata__", {})
    assert all(isinstance(v, str) for v in metadata.values()), "metadata values must be strings"
    spans, out = [], {}
    for name, e in header.items():
        dtype, shape, (b, en) = e["dtype"], e["shape"], e["data_offsets"]
        count = int(np.prod(shape)) if shape else 1
        assert en - b == count * SIZES[dtype], f"{name}: {en - b} bytes for {shape} {dtype}"
        spans.append((b, en))
        raw = buf[b:en]
        if dtype == "BF16":
            arr = np.frombuffer(raw, dtype="<u2").reshape(shape)
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(NUMPY[dtype]).newbyteorder("<")).reshape(shape)
        out[name] = (dtype, arr)
    spans.sort()
    at = 0
    for b, en in spans:  # the tensors tile the buffer: no holes, no overlaps
        assert b == at, f"{path}: hole or overlap at {b} (expected {at})"
        at = en
    assert at == len(buf), f"{path}: {len(buf) - at} bytes after the last tensor"
    return out, metadata


def read(path):
    """A file, an index, or a sharded model by its index: (name -> float32 array, dtypes, metadata)."""
    if path.endswith(".json"):
        index = json.load(open(path))
        d = os.path.dirname(path)
        tensors, dtypes = {}, {}
        for fname in sorted(set(index["weight_map"].values())):
            got, _ = read_file(os.path.join(d, fname))
            for name, (dt, arr) in got.items():
                assert index["weight_map"][name] == fname, f"{name} in {fname}, index says {index['weight_map'][name]}"
                tensors[name] = as_f32(dt, arr)
                dtypes[name] = dt
        assert set(tensors) == set(index["weight_map"]), "index and files disagree"
        return tensors, dtypes, index.get("metadata", {})
    got, metadata = read_file(path)
    return {k: as_f32(dt, a) for k, (dt, a) in got.items()}, {k: dt for k, (dt, _) in got.items()}, metadata


def as_f32(dtype, arr):
    if dtype == "BF16":
        return bf16_to_f32(arr)
    return arr.astype(np.float32)


def write(path, tensors, metadata=None):
    """tensors: name -> (dtype, np array holding the stored values; BF16 as uint16 bit patterns)."""
    header, chunks, at = {}, [], 0
    for name, (dtype, arr) in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [at, at + len(raw)]}
        chunks.append(raw)
        at += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)
