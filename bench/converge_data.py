#!/usr/bin/env python3
"""Data of the convergence check (bench/run_converge_gpu.sh): a corpus of real text that any
Debian or Ubuntu machine holds offline, a byte-level BPE tokenizer trained on it, and the corpus
as one token stream.

    python3 bench/converge_data.py --out DIR [--max-bytes 32000000] [--vocab 16384]

Writes DIR/tokenizer.json, DIR/tokens.i32 (flat little-endian int32: every document's ids
followed by the end-of-text id) and DIR/corpus.json (what went in, from where, how long it
took). Sources, in order: /usr/share/doc (plain text files, .gz ones decompressed),
/usr/share/common-licenses, then the .md/.rst/.txt files and package metadata (METADATA,
LICENSE*) of Python's site-packages; when those give less than --min-bytes, Python sources of
the standard library and site-packages fill up to it. Files are deduplicated by content,
each is cut to --file-bytes, the documents are shuffled with a fixed seed (so consecutive
windows of the stream mix sources) and taken up to --max-bytes. Nothing is held out: the
check compares training losses.
"""
import argparse
import array
import gzip
import hashlib
import json
import os
import random
import site
import sys
import sysconfig
import time

EOT = "<|endoftext|>"
# Markup, data and images: not prose, or not text at all.
SKIP_EXT = {".html", ".htm", ".css", ".js", ".json", ".xml", ".svg", ".png", ".jpg", ".jpeg",
            ".gif", ".ico", ".pdf", ".woff", ".woff2", ".ttf", ".otf", ".so", ".a", ".o",
            ".pyc", ".zip", ".xz", ".bz2", ".zst", ".tar", ".whl", ".egg", ".db", ".bin",
            ".gpg", ".asc", ".sig", ".pem", ".crt"}
# Package bookkeeping: lists of names and hashes.
SKIP_NAMES = {"RECORD", "INSTALLER", "REQUESTED", "WHEEL", "top_level.txt",
              "entry_points.txt", "dependency_links.txt", "SOURCES.txt", "installed-files.txt",
              "requires.txt", "not-zip-safe", "namespace_packages.txt", "direct_url.json"}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for tokenizer.json, tokens.i32, corpus.json")
    p.add_argument("--max-bytes", type=int, default=32_000_000, help="corpus cap (UTF-8 bytes)")
    p.add_argument("--min-bytes", type=int, default=0,
                   help="below this, Python sources fill the corpus (default: max-bytes / 2)")
    p.add_argument("--file-bytes", type=int, default=1_000_000, help="cap per document")
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--seed", type=int, default=1234, help="document shuffle")
    return p.parse_args()


def read_text(path, cap):
    """The file's text (gzip decompressed), or None when it is not UTF-8 prose-like text."""
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                raw = f.read(cap + 1)
        else:
            with open(path, "rb") as f:
                raw = f.read(cap + 1)
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    if not raw or b"\0" in raw:
        return None
    if len(raw) > cap:   # cut at a line end so the cut does not split a character
        cut = raw.rfind(b"\n", 0, cap)
        raw = raw[:cut if cut > 0 else cap]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    text = text.replace("\r\n", "\n").strip()
    if len(text) < 64:
        return None
    printable = sum(c.isprintable() or c in "\n\t" for c in text[:4096])
    if printable < 0.95 * min(len(text), 4096):
        return None
    return text


def walk(root):
    """Regular files under root in a fixed order (symbolic links to files are followed,
    to folders not: a link farm would repeat whole trees)."""
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(d, name)
            if os.path.isfile(path):
                yield path


def ext_of(name):
    base = name[:-3] if name.endswith(".gz") else name
    return os.path.splitext(base)[1].lower()


def site_dirs():
    dirs = set(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    for key in ("purelib", "platlib"):
        dirs.add(sysconfig.get_paths()[key])
    dirs.add(site.getusersitepackages())
    for d in ("/usr/lib/python3/dist-packages",):
        dirs.add(d)
    return sorted(d for d in dirs if os.path.isdir(d))


def sources():
    """(source name, predicate on a path, roots) in order of preference."""
    def doc_file(path):
        return ext_of(os.path.basename(path)) not in SKIP_EXT and os.path.basename(path) not in SKIP_NAMES

    def pkg_text(path):
        name = os.path.basename(path)
        if name in SKIP_NAMES:
            return False
        if name == "METADATA" or name.startswith(("LICENSE", "COPYING", "README", "NOTICE")):
            return True
        return ext_of(name) in (".md", ".rst", ".txt")

    return [("usr-share-doc", doc_file, ["/usr/share/doc"]),
            ("common-licenses", doc_file, ["/usr/share/common-licenses"]),
            ("site-packages-text", pkg_text, site_dirs())]


def python_sources():
    roots = [sysconfig.get_paths()["stdlib"]] + site_dirs()
    return ("python-sources", lambda p: p.endswith(".py"), roots)


def gather(a):
    seen, docs, report = set(), [], {}
    min_bytes = a.min_bytes or a.max_bytes // 2

    def take(name, keep, roots, limit):
        r = report.setdefault(name, {"roots": roots, "files": 0, "duplicates": 0, "bytes": 0})
        total = sum(len(d[1]) for d in docs)
        for root in roots:
            for path in walk(root):
                if total >= limit:
                    return
                if not keep(path):
                    continue
                text = read_text(path, a.file_bytes)
                if text is None:
                    continue
                h = hashlib.sha1(text.encode("utf-8")).digest()
                if h in seen:
                    r["duplicates"] += 1
                    continue
                seen.add(h)
                n = len(text.encode("utf-8"))
                docs.append((name, text))
                r["files"] += 1
                r["bytes"] += n
                total += n

    # Every primary source is read whole (then shuffled and capped), so the cap does not
    # favour the first source's alphabetically early packages.
    for name, keep, roots in sources():
        take(name, keep, roots, float("inf"))
    if sum(len(d[1]) for d in docs) < min_bytes:
        name, keep, roots = python_sources()
        take(name, keep, roots, min_bytes)
    random.Random(a.seed).shuffle(docs)
    out, total = [], 0
    for name, text in docs:
        n = len(text.encode("utf-8"))
        if total + n > a.max_bytes:
            continue
        out.append(text)
        total += n
        report[name]["kept_files"] = report[name].get("kept_files", 0) + 1
        report[name]["kept_bytes"] = report[name].get("kept_bytes", 0) + n
    return out, total, report


def train_tokenizer(docs, vocab):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(docs, trainer, length=len(docs))
    return tok


def write_tokens(tok, docs, path):
    eot = tok.token_to_id(EOT)
    ids = array.array("i")
    if ids.itemsize != 4 or sys.byteorder != "little":
        sys.exit("converge_data: needs a little-endian host with 4-byte int")
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    n = 0
    with open(path, "wb") as f:
        for i in range(0, len(docs), 2048):   # bounded memory: encodings hold offsets too
            for enc in encode(docs[i:i + 2048]):
                ids.extend(enc.ids)
                ids.append(eot)
            n += len(ids)
            ids.tofile(f)
            del ids[:]
    return n, eot


def main():
    a = parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    os.makedirs(a.out, exist_ok=True)
    t0 = time.perf_counter()
    docs, total, report = gather(a)
    t1 = time.perf_counter()
    if total < 1000:
        sys.exit(f"converge_data: only {total} bytes of text found offline")
    print(f"corpus: {len(docs)} documents, {total / 1e6:.1f} MB in {t1 - t0:.1f} s", flush=True)
    for name, r in report.items():
        print(f"  {name}: {r['files']} files ({r['bytes'] / 1e6:.1f} MB) read, "
              f"{r['duplicates']} duplicates dropped, {r.get('kept_files', 0)} files "
              f"({r.get('kept_bytes', 0) / 1e6:.1f} MB) in the corpus", flush=True)
    tok = train_tokenizer(docs, a.vocab)
    tok.save(os.path.join(a.out, "tokenizer.json"))
    t2 = time.perf_counter()
    vocab = tok.get_vocab_size()
    print(f"tokenizer: byte-level BPE, vocabulary {vocab} (asked {a.vocab}) in {t2 - t1:.1f} s",
          flush=True)
    n, eot = write_tokens(tok, docs, os.path.join(a.out, "tokens.i32"))
    t3 = time.perf_counter()
    print(f"tokens: {n} ({total / n:.2f} bytes a token), end-of-text id {eot}, "
          f"in {t3 - t2:.1f} s", flush=True)
    info = {"documents": len(docs), "bytes": total, "max_bytes": a.max_bytes,
            "file_bytes": a.file_bytes, "sources": report, "vocab": vocab, "vocab_asked": a.vocab,
            "eot_id": eot, "tokens": n, "shuffle_seed": a.seed,
            "seconds": {"gather": round(t1 - t0, 1), "tokenizer": round(t2 - t1, 1),
                        "tokenize": round(t3 - t2, 1)}}
    with open(os.path.join(a.out, "corpus.json"), "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
