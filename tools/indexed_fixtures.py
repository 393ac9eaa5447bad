#!/usr/bin/env python3
"""Megatron indexed-dataset fixtures and compatibility checks for data/indexed.

  python3 tools/indexed_fixtures.py make OUTDIR
      writes OUTDIR/megatron_u16.{bin,idx}, OUTDIR/megatron_i32.{bin,idx} and
      OUTDIR/contents.json (the documents they hold) with Megatron-Core's
      IndexedDatasetBuilder when megatron.core imports, otherwise with a numpy
      writer of the same documented layout.
  python3 tools/indexed_fixtures.py check PREFIX CONTENTS_JSON NAME
      reads PREFIX with Megatron-Core's IndexedDataset (or the numpy reader) and
      checks it holds the documents listed under NAME; exit 1 on any difference.

The layout (megatron/core/datasets/indexed_dataset.py): b"MMIDIDX\\x00\\x00", u64 version 1,
u8 dtype code, u64 sequence count, u64 document count, int32 lengths, int64 byte pointers,
int64 document indices (starting at 0, ending at the sequence count).
"""
import json
import os
import struct
import sys

import numpy as np

CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
         7: np.float32, 8: np.uint16}

# Each document is a list of sequences (token lists); an empty sequence is allowed.
DOCS = {
    "megatron_u16": (np.uint16, [[[1, 2, 3], [4]], [[65000, 7]], [[]], [[9, 9, 9, 9, 5]],
                                 [[0], [1], [2]]]),
    "megatron_i32": (np.int32, [[[100000, 3, 2147483647]], [[5], []], [[6, 7, 8, 9]]]),
}


def have_megatron():
    try:
        from megatron.core.datasets import indexed_dataset  # noqa: F401
        return True
    except Exception as e:  # the package may be missing or miss one of its own imports
        print(f"megatron.core not usable ({type(e).__name__}: {e}); using the numpy layout",
              file=sys.stderr)
        return False


def write_numpy(prefix, dtype, docs):
    lengths, doc_idx, data = [], [0], bytearray()
    for doc in docs:
        for seq in doc:
            data += np.array(seq, dtype=dtype).tobytes()
            lengths.append(len(seq))
        doc_idx.append(len(lengths))
    item = np.dtype(dtype).itemsize
    ptrs = np.concatenate([[0], np.cumsum(np.array(lengths, dtype=np.int64) * item)[:-1]])
    code = [c for c, t in CODES.items() if t == dtype][0]
    with open(prefix + ".bin", "wb") as f:
        f.write(bytes(data))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code))
        f.write(struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(doc_idx)))
        f.write(np.array(lengths, dtype=np.int32).tobytes())
        f.write(np.array(ptrs, dtype=np.int64).tobytes())
        f.write(np.array(doc_idx, dtype=np.int64).tobytes())


def write_megatron(prefix, dtype, docs):
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for doc in docs:
        for seq in doc:
            b.add_item(torch.tensor(seq, dtype=torch.int64))
        b.end_document()
    b.finalize(prefix + ".idx")


def read_numpy(prefix):
    raw = open(prefix + ".idx", "rb").read()
    assert raw[:9] == b"MMIDIDX\x00\x00", "bad magic"
    assert struct.unpack("<Q", raw[9:17])[0] == 1, "bad version"
    dtype = CODES[raw[17]]
    ns, nd = struct.unpack("<QQ", raw[18:34])
    lengths = np.frombuffer(raw, np.int32, ns, 34)
    ptrs = np.frombuffer(raw, np.int64, ns, 34 + 4 * ns)
    doc_idx = np.frombuffer(raw, np.int64, nd, 34 + 12 * ns)
    assert 34 + 12 * ns + 8 * nd == len(raw), "index size"
    binb = open(prefix + ".bin", "rb").read()
    seqs = [np.frombuffer(binb, dtype, int(n), int(p)).tolist() for n, p in zip(lengths, ptrs)]
    return dtype, seqs, doc_idx.tolist()


def read_megatron(prefix):
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    ds = IndexedDataset(prefix)
    seqs = [ds[i].tolist() for i in range(len(ds))]
    return ds.index.dtype, seqs, ds.document_indices.tolist()


def expected(docs):
    seqs, doc_idx = [], [0]
    for doc in docs:
        seqs += [list(s) for s in doc]
        doc_idx.append(len(seqs))
    return seqs, doc_idx


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "make":
        out = sys.argv[2]
        os.makedirs(out, exist_ok=True)
        use_mc = have_megatron()
        contents = {}
        for name, (dtype, docs) in DOCS.items():
            (write_megatron if use_mc else write_numpy)(os.path.join(out, name), dtype, docs)
            contents[name] = {"dtype": np.dtype(dtype).name, "docs": docs,
                              "writer": "megatron.core" if use_mc else "numpy"}
        with open(os.path.join(out, "contents.json"), "w") as f:
            json.dump(contents, f)
            f.write("\n")
        return 0
    if len(sys.argv) == 5 and sys.argv[1] == "check":
        prefix, contents, name = sys.argv[2], json.load(open(sys.argv[3])), sys.argv[4]
        ent = contents[name]
        dtype, seqs, doc_idx = (read_megatron if have_megatron() else read_numpy)(prefix)
        want_seqs, want_doc = expected(ent["docs"])
        ok = np.dtype(dtype).name == ent["dtype"] and seqs == want_seqs and doc_idx == want_doc
        if not ok:
            print(f"{prefix}: mismatch: dtype {np.dtype(dtype).name} seqs {seqs} docs {doc_idx}; "
                  f"expected {ent['dtype']} {want_seqs} {want_doc}", file=sys.stderr)
            return 1
        print(f"{prefix}: {len(seqs)} sequences, {len(doc_idx) - 1} documents match")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
