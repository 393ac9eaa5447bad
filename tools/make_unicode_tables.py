#!/usr/bin/env python3
# Writes data/unicode_tables.c and data/unicode_tables.h: the Unicode data the tokenizer uses
# instead of PCRE2's and the C library's, frozen at the versions Hugging Face tokenizers 0.23
# actually runs, so that ids do not change with the distribution's library versions.
#
# Where each table comes from (found by probing tokenizers 0.23.3 on every code point, see
# --check):
#   general categories  unicodedata2==16.0.0. HF's Split and ByteLevel regexes run on the onig
#                       crate (Oniguruma), whose \p{..} classes are exactly Unicode 16.0.0.
#   White_Space         the 25 code points of PropList.txt (unchanged since Unicode 6.3): \s of
#                       Oniguruma, and what lstrip/rstrip of added tokens strip.
#   word characters     from the categories above plus the Other_Alphabetic symbols of
#                       Unicode 16.0.0 (circled and squared Latin letters). Oniguruma's \w adds
#                       the Latin-1 superscripts and fractions; the regex crate's \w (around
#                       single_word added tokens) adds U+200C and U+200D instead.
#   normalization       unicodedata2==9.0.0.post4. HF's NFC/NFD/NFKC/NFKD come from the
#                       unicode-normalization-alignments crate, whose decomposition,
#                       composition and combining-class tables are Unicode 9.0.0.
#
# The pinned unicodedata2 versions are installed with pip under --cache (9.0.0.post4 predates
# Python 3.10, so its sdist gets the two-line fix it needs to build there).
#
# usage: python3 tools/make_unicode_tables.py [--check] [--cache DIR] [OUTDIR (default: data)]
#   --check  also probes the installed HF tokenizers on every code point and fails unless the
#            tables reproduce it (needs tokenizers==0.23.3; takes a few minutes)
import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile

GC_VERSION = "16.0.0"
NF_VERSION = "9.0.0.post4"

# Order of the C enum tr_uni_gc; Cn first so that unassigned code points are 0.
GCS = ["Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd",
       "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf",
       "Cs", "Co"]

WHITE_SPACE = [(0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680),
               (0x2000, 0x200A), (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F),
               (0x3000, 0x3000)]
# Other_Alphabetic code points that are neither letters nor marks (PropList.txt 16.0.0).
ALPHA_SYMBOLS = [(0x24B6, 0x24E9), (0x1F130, 0x1F149), (0x1F150, 0x1F169), (0x1F170, 0x1F189)]
ONIG_WORD_EXTRA = [(0xB2, 0xB3), (0xB9, 0xB9), (0xBC, 0xBE)]
ADDED_WORD_EXTRA = [(0x200C, 0x200D)]
HANGUL_V = (0x1161, 0x1175)
HANGUL_T = (0x11A8, 0x11C2)
HANGUL_S = (0xAC00, 0xD7A3)

# Per-kind flag bits (tr_uni_kind_props >> 5), as the C header names them.
FLAGS = ["SPACE", "WORD_ONIG", "WORD_ADDED", "NFC_INERT", "NFD_INERT", "NFKC_INERT",
         "NFKD_INERT"]
BLOCK = 128  # code points per block of the two-stage table built at run time


def in_ranges(c, ranges):
    return any(a <= c <= b for a, b in ranges)


# ---- pinned unicodedata2 installs ----

UCNHASH_SHIM = """#ifndef Py_UCNHASH_H
#define Py_UCNHASH_H
#define PyUnicodeData_CAPSULE_NAME "unicodedata.ucnhash_CAPI"
typedef struct {
    int size;
    int (*getname)(PyObject *self, Py_UCS4 code, char *buffer, int buflen, int aliases);
    int (*getcode)(PyObject *self, const char *name, int namelen, Py_UCS4 *code, int seqs);
} _PyUnicode_Name_CAPI;
#endif
"""


def pip(*args, quiet=False):
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True,
                   capture_output=quiet)


def install_ucd(version, cache):
    target = os.path.join(cache, version)
    if os.path.isdir(target) and any(f.startswith("unicodedata2") and f.endswith(".so")
                                     for f in os.listdir(target)):
        return target
    try:
        pip("install", "--no-deps", "--target", target, "unicodedata2==" + version, quiet=True)
        return target
    except subprocess.CalledProcessError:
        pass
    # Old sdists include CPython's private ucnhash.h (gone since 3.10) and assign Py_TYPE.
    with tempfile.TemporaryDirectory() as tmp:
        pip("download", "--no-deps", "--no-binary", ":all:", "-d", tmp, "unicodedata2==" + version)
        sdist = [f for f in os.listdir(tmp) if f.endswith(".tar.gz")][0]
        with tarfile.open(os.path.join(tmp, sdist)) as tf:
            tf.extractall(tmp)
        src = os.path.join(tmp, sdist[:-len(".tar.gz")])
        for root, _, files in os.walk(src):
            for f in files:
                if f == "unicodedata.c":
                    p = os.path.join(root, f)
                    with open(p) as fh:
                        code = fh.read()
                    code = code.replace("Py_TYPE(&UCD_Type) = &PyType_Type;",
                                        "Py_SET_TYPE(&UCD_Type, &PyType_Type);")
                    with open(p, "w") as fh:
                        fh.write(code)
                    with open(os.path.join(root, "ucnhash.h"), "w") as fh:
                        fh.write(UCNHASH_SHIM)
        pip("install", "--no-deps", "--no-build-isolation", "--target", target, src)
    return target


DUMP_GC = r"""
import json, sys
import unicodedata2 as u
assert u.unidata_version == sys.argv[1], u.unidata_version
json.dump("".join(chr(65 + %r.index(u.category(chr(c)))) for c in range(0x110000)), sys.stdout)
""" % (GCS,)

DUMP_NF = r"""
import json, sys
import unicodedata2 as u
assert u.unidata_version == sys.argv[1], u.unidata_version
out = {"ccc": {}, "map": {}, "nf": {f: {} for f in ("NFC", "NFD", "NFKC", "NFKD")}}
for c in range(0x110000):
    if 0xD800 <= c <= 0xDFFF:
        continue
    ch = chr(c)
    if u.combining(ch):
        out["ccc"][c] = u.combining(ch)
    d = u.decomposition(ch)
    if d:
        out["map"][c] = d
    for f in out["nf"]:
        n = u.normalize(f, ch)
        if n != ch:
            out["nf"][f][c] = [ord(x) for x in n]
json.dump(out, sys.stdout)
"""


def run_ucd(target, script, version):
    env = dict(os.environ, PYTHONPATH=target)
    r = subprocess.run([sys.executable, "-c", script, version], env=env, check=True,
                       capture_output=True, text=True)
    return json.loads(r.stdout)


# ---- the tables ----

def build(gc_str, nf):
    gc = [ord(x) - 65 for x in gc_str]
    ccc = {int(k): v for k, v in nf["ccc"].items()}
    maps = {int(k): v for k, v in nf["map"].items()}
    norm = {f: {int(k): v for k, v in d.items()} for f, d in nf["nf"].items()}

    def full(f, c):
        return norm[f].get(c, [c])

    # Primary composites: a two-element canonical mapping that NFC gives back.
    comps = []
    for c, m in maps.items():
        if m.startswith("<"):
            continue
        parts = [int(x, 16) for x in m.split()]
        if len(parts) == 2 and full("NFC", c) == [c]:
            comps.append((parts[0], parts[1], c))
    comps.sort()
    seconds = {b for _, b, _ in comps}
    seconds.update(range(HANGUL_V[0], HANGUL_V[1] + 1))
    seconds.update(range(HANGUL_T[0], HANGUL_T[1] + 1))

    def inert(composing, f, dform, c):
        # Nothing before c changes c or merges with it, and the form leaves c alone, so the
        # normalizer may cut the text right before c.
        if ccc.get(c, 0) or full(f, c) != [c]:
            return False
        if not composing:
            return True
        first = full(dform, c)[0]
        return ccc.get(first, 0) == 0 and first not in seconds

    kinds, kind_of = {}, []
    for c in range(0x110000):
        g = GCS[gc[c]]
        word = g[0] in "LM" or g in ("Nd", "Nl", "Pc") or in_ranges(c, ALPHA_SYMBOLS)
        flags = [in_ranges(c, WHITE_SPACE),
                 word or in_ranges(c, ONIG_WORD_EXTRA),
                 word or in_ranges(c, ADDED_WORD_EXTRA),
                 inert(True, "NFC", "NFD", c), inert(False, "NFD", "NFD", c),
                 inert(True, "NFKC", "NFKD", c), inert(False, "NFKD", "NFKD", c)]
        if 0xD800 <= c <= 0xDFFF:
            flags = [False] * len(FLAGS)
        props = gc[c] | sum(1 << (5 + i) for i, f in enumerate(flags) if f)
        kind_of.append(kinds.setdefault(props, len(kinds)))
    assert len(kinds) < 256
    runs = [(c, kind_of[c]) for c in range(0x110000) if c == 0 or kind_of[c] != kind_of[c - 1]]
    blocks = {tuple(kind_of[i:i + BLOCK]) for i in range(0, 0x110000, BLOCK)}

    ccc_runs = [(c, ccc.get(c, 0)) for c in range(0x110000)
                if c == 0 or ccc.get(c, 0) != ccc.get(c - 1, 0)]

    def is_hangul(c):
        return HANGUL_S[0] <= c <= HANGUL_S[1]

    canon = [(c, v) for c, v in sorted(norm["NFD"].items()) if not is_hangul(c)]
    compat = [(c, v) for c, v in sorted(norm["NFKD"].items())
              if not is_hangul(c) and v != full("NFD", c)]
    return {"kinds": sorted(kinds, key=kinds.get), "runs": runs, "n_blocks": len(blocks),
            "ccc_runs": ccc_runs, "canon": canon, "compat": compat, "comps": comps}


# ---- C output ----

def rows(items, per_line, indent="    "):
    out = []
    for i in range(0, len(items), per_line):
        out.append(indent + " ".join(x + "," for x in items[i:i + per_line]))
    return "\n".join(out)


HEADER_COMMENT = """\
// Generated by tools/make_unicode_tables.py; do not edit. Regenerate with
//   python3 tools/make_unicode_tables.py --check
// Unicode data frozen at what Hugging Face tokenizers 0.23 uses: general categories, White_Space
// and word characters of Unicode 16.0.0 (its regexes), normalization data of Unicode 9.0.0."""


def write_c(t, outdir):
    h = [HEADER_COMMENT, "#pragma once", "#include <stddef.h>", "#include <stdint.h>", ""]
    h.append("// General categories; tr_uni_kind_props & 31.")
    h.append("enum tr_uni_gc {")
    h.append(rows(["TR_UNI_" + g.upper() for g in GCS], 10))
    h.append("    TR_UNI_N_GC")
    h.append("};")
    h.append("")
    h.append("// Flags: tr_uni_kind_props >> 5. *_INERT: the normal form leaves the code point")
    h.append("// as it is and the text may be cut right before it.")
    for i, f in enumerate(FLAGS):
        h.append("#define TR_UNI_%s (1u << %d)" % (f, i))
    h.append("")
    h.append("// Code points fall into kinds: one general category and one set of flags each.")
    h.append("#define TR_UNI_N_KINDS %d" % len(t["kinds"]))
    h.append("extern const uint16_t tr_uni_kind_props[TR_UNI_N_KINDS];")
    h.append("// Runs of equal kind, sorted: start << 8 | kind; the last run ends at U+10FFFF.")
    h.append("#define TR_UNI_N_KIND_RUNS %d" % len(t["runs"]))
    h.append("extern const uint32_t tr_uni_kind_runs[TR_UNI_N_KIND_RUNS];")
    h.append("// Distinct %d-code-point blocks of the kind table (for the two-stage lookup)."
             % BLOCK)
    h.append("#define TR_UNI_BLOCK %d" % BLOCK)
    h.append("#define TR_UNI_N_BLOCKS %d" % t["n_blocks"])
    h.append("")
    h.append("// Canonical combining classes: start << 8 | ccc, sorted.")
    h.append("#define TR_UNI_N_CCC_RUNS %d" % len(t["ccc_runs"]))
    h.append("extern const uint32_t tr_uni_ccc_runs[TR_UNI_N_CCC_RUNS];")
    h.append("")
    h.append("// Full decompositions (Hangul syllables excepted: they are computed): code point,")
    h.append("// then offset and length in tr_uni_decomp_cps. tr_uni_compat holds only the code")
    h.append("// points whose compatibility decomposition differs from the canonical one.")
    h.append("typedef struct tr_uni_decomp {")
    h.append("    uint32_t cp;")
    h.append("    uint16_t off, len;")
    h.append("} tr_uni_decomp;")
    h.append("#define TR_UNI_N_CANON %d" % len(t["canon"]))
    h.append("#define TR_UNI_N_COMPAT %d" % len(t["compat"]))
    cps = []
    canon_e, compat_e = [], []
    for src, dst in ((t["canon"], canon_e), (t["compat"], compat_e)):
        for c, v in src:
            dst.append((c, len(cps), len(v)))
            cps.extend(v)
    assert len(cps) < 65536
    h.append("#define TR_UNI_N_DECOMP_CPS %d" % len(cps))
    h.append("extern const tr_uni_decomp tr_uni_canon[TR_UNI_N_CANON];")
    h.append("extern const tr_uni_decomp tr_uni_compat[TR_UNI_N_COMPAT];")
    h.append("extern const uint32_t tr_uni_decomp_cps[TR_UNI_N_DECOMP_CPS];")
    h.append("")
    h.append("// Canonical compositions (first, second, composite), sorted by first then second;")
    h.append("// Hangul syllables are computed.")
    h.append("#define TR_UNI_N_COMPS %d" % len(t["comps"]))
    h.append("extern const uint32_t tr_uni_comps[TR_UNI_N_COMPS][3];")
    h.append("")

    c = [HEADER_COMMENT, '#include "data/unicode_tables.h"', ""]
    c.append("const uint16_t tr_uni_kind_props[TR_UNI_N_KINDS] = {")
    c.append(rows(["0x%04x" % k for k in t["kinds"]], 10))
    c.append("};")
    c.append("")
    c.append("const uint32_t tr_uni_kind_runs[TR_UNI_N_KIND_RUNS] = {")
    c.append(rows(["0x%x" % (s << 8 | k) for s, k in t["runs"]], 10))
    c.append("};")
    c.append("")
    c.append("const uint32_t tr_uni_ccc_runs[TR_UNI_N_CCC_RUNS] = {")
    c.append(rows(["0x%x" % (s << 8 | k) for s, k in t["ccc_runs"]], 10))
    c.append("};")
    c.append("")
    for name, ents in (("canon", canon_e), ("compat", compat_e)):
        c.append("const tr_uni_decomp tr_uni_%s[TR_UNI_N_%s] = {" % (name, name.upper()))
        c.append(rows(["{0x%x, %d, %d}" % e for e in ents], 6))
        c.append("};")
        c.append("")
    c.append("const uint32_t tr_uni_decomp_cps[TR_UNI_N_DECOMP_CPS] = {")
    c.append(rows(["0x%x" % x for x in cps], 12))
    c.append("};")
    c.append("")
    c.append("const uint32_t tr_uni_comps[TR_UNI_N_COMPS][3] = {")
    c.append(rows(["{0x%x, 0x%x, 0x%x}" % e for e in t["comps"]], 4))
    c.append("};")
    with open(os.path.join(outdir, "unicode_tables.h"), "w") as f:
        f.write("\n".join(h))
    with open(os.path.join(outdir, "unicode_tables.c"), "w") as f:
        f.write("\n".join(c) + "\n")


# ---- --check: probe HF tokenizers on every code point ----

def check(t, gc_str, nf):
    import tokenizers
    from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers
    if tokenizers.__version__ != "0.23.3":
        print("warning: checking against tokenizers %s, the tables are for 0.23.3"
              % tokenizers.__version__, file=sys.stderr)
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    text = "".join(map(chr, cps))
    kind_of = [0] * 0x110000
    for i, (s, k) in enumerate(t["runs"]):
        e = t["runs"][i + 1][0] if i + 1 < len(t["runs"]) else 0x110000
        kind_of[s:e] = [k] * (e - s)

    def ours(pred):
        return {c for c in cps if pred(t["kinds"][kind_of[c]])}

    def flag(name):
        bit = 1 << (5 + FLAGS.index(name))
        return lambda p: bool(p & bit)

    def onig(pattern):
        kept = set()
        split = pre_tokenizers.Split(Regex(pattern), behavior="removed")
        for piece, _ in split.pre_tokenize_str(text):
            kept.update(map(ord, piece))
        return {c for c in cps if c not in kept}

    bad = []

    def same(what, theirs, mine):
        if theirs != mine:
            diff = sorted(theirs ^ mine)
            bad.append("%s: %d code points differ, first %s" % (
                what, len(diff), " ".join("U+%04X" % x for x in diff[:8])))
        print("checked %s" % what, file=sys.stderr)

    for g in GCS:
        gi = GCS.index(g)
        same("\\p{%s}" % g, onig(r"\p{%s}" % g), ours(lambda p, gi=gi: p & 31 == gi))
    for grp in "LMNPSZC":
        same("\\p{%s}" % grp, onig(r"\p{%s}" % grp), ours(lambda p, grp=grp: GCS[p & 31][0] == grp))
    same("\\s", onig(r"\s"), ours(flag("SPACE")))
    same("\\w", onig(r"\w"), ours(flag("WORD_ONIG")))
    same("\\d", onig(r"\d"), ours(lambda p: GCS[p & 31] == "Nd"))

    # Added tokens: single_word looks at \w next to the match, lstrip takes \s before it.
    tok = Tokenizer(models.WordLevel({"a": 0}, unk_token="a"))
    tok.add_tokens([AddedToken("QQ", single_word=True, normalized=False)])
    tok.add_special_tokens([AddedToken("ZZ", lstrip=True, normalized=False)])
    qq, zz = tok.token_to_id("QQ"), tok.token_to_id("ZZ")
    word, space = set(), set()
    for i in range(0, len(cps), 65536):
        chunk = cps[i:i + 65536]
        for c, e in zip(chunk, tok.encode_batch([chr(c) + "QQ" for c in chunk],
                                                add_special_tokens=False)):
            if qq not in e.ids:
                word.add(c)
        for c, e in zip(chunk, tok.encode_batch([chr(c) + "ZZ" for c in chunk],
                                                add_special_tokens=False)):
            if e.ids[0] == zz and c != ord("Z"):
                space.add(c)
    same("added-token \\w", word, ours(flag("WORD_ADDED")))
    same("added-token \\s", space, ours(flag("SPACE")))

    # Normalizers on each code point alone (NUL between them: a starter nothing composes with).
    norm = {f: {int(k): v for k, v in d.items()} for f, d in nf["nf"].items()}
    no_nul = [c for c in cps if c]
    joined = "\0".join(map(chr, no_nul))
    for f in ("NFC", "NFD", "NFKC", "NFKD"):
        got = getattr(normalizers, f)().normalize_str(joined).split("\0")
        theirs = {c for c, s in zip(no_nul, got) if [ord(x) for x in s] != norm[f].get(c, [c])}
        same(f + " of each code point", theirs, set())
    # Combining classes: "a" + c + m reorders exactly when ccc(c) > ccc(m) > 0.
    ccc = {int(k): v for k, v in nf["ccc"].items()}
    refs = {}
    for c in sorted(ccc):
        if ccc[c] not in refs and c not in norm["NFD"]:
            refs[ccc[c]] = chr(c)
    nfd = normalizers.NFD()
    plain = [c for c in no_nul if c not in norm["NFD"]]
    probe = "\0".join("a%s\u0334\0a\u0301%s" % (chr(c), chr(c)) for c in plain)
    got = nfd.normalize_str(probe).split("\0")
    nonzero = {c for k, c in enumerate(plain)
               if got[2 * k] != "a%s\u0334" % chr(c) or got[2 * k + 1] != "a\u0301" + chr(c)}
    theirs = {}
    for c in nonzero:
        above = [k for k in sorted(refs)
                 if nfd.normalize_str("a" + chr(c) + refs[k]) != "a" + chr(c) + refs[k]]
        higher = [k for k in sorted(refs) if k > (max(above) if above else 0)]
        theirs[c] = higher[0] if higher else 255
    mine = {c: v for c, v in ccc.items() if c not in norm["NFD"]}
    same("combining classes", {c for c in set(theirs) | set(mine)
                               if theirs.get(c) != mine.get(c)}, set())
    if bad:
        print("\n".join(bad), file=sys.stderr)
        sys.exit(1)
    print("tables reproduce tokenizers %s on every code point" % tokenizers.__version__,
          file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description="Writes data/unicode_tables.[ch].")
    ap.add_argument("outdir", nargs="?", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "data"))
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--cache", default=os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "troupe-unicodedata2"))
    a = ap.parse_args()
    gc_str = run_ucd(install_ucd(GC_VERSION, a.cache), DUMP_GC, GC_VERSION)
    nf = run_ucd(install_ucd(NF_VERSION, a.cache), DUMP_NF, NF_VERSION.split(".post")[0])
    t = build(gc_str, nf)
    write_c(t, a.outdir)
    print("%d kinds, %d kind runs, %d blocks, %d ccc runs, %d+%d decompositions, %d compositions"
          % (len(t["kinds"]), len(t["runs"]), t["n_blocks"], len(t["ccc_runs"]), len(t["canon"]),
             len(t["compat"]), len(t["comps"])), file=sys.stderr)
    if a.check:
        check(t, gc_str, nf)


if __name__ == "__main__":
    main()
