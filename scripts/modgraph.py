#!/usr/bin/env python3
"""Module dependency picture of the workspace's library crates.

For each crate under crates/ it reads the top-level modules of src/ (a file `src/x.rs` or a
folder `src/x/`), finds which other top-level modules each one names (`crate::y`, `super::y` from
a top-level file, `use y::` inside lib.rs does not count), and prints:

- the edges, as a Graphviz `dot` file (`--dot FILE`, render with `dot -Tsvg FILE`);
- the module cycles (strongly connected components larger than one module);
- the number of public items per crate: `pub` fn/struct/enum/trait/type/const/static/mod/use
  declarations, not `pub(crate)` or `pub(super)` ones (a text count, close to what rustdoc shows).

With `--files`, it also draws the graph file by file (every module file of every crate, the
binary's too: `crate::a::b::Item` and `super::x` resolved to the file that defines the module,
through `pub use` re-exports; `mod x;` declarations, re-exports themselves and `#[cfg(test)]`
modules are no edges)
and lists the cycles between files.

`--check` exits 1 when a crate named with `--acyclic CRATE` has a cycle (between top-level
modules, or with `--files` between files), when a module named
with `--only-imported-by CRATE:MODULE=ROOT` is imported by any module other than ROOT, or when
a module named with `--no-crate CRATE:MODULE=DEP[,DEP...]` names one of those dependencies
(`DEP::`, `use DEP`) in its code (comments aside). Read-only:
it never writes anything but the `--dot` file.
"""

import argparse
import os
import re
import sys

CRATES = "crates"
PUB_ITEM = re.compile(r"^\s*pub\s+(?:async\s+|unsafe\s+|const\s+)*(fn|struct|enum|trait|type|const|static|mod|use|union)\b")
CRATE_REF = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")


def modules(src):
    """Top-level module name -> list of its files."""
    mods = {}
    for entry in sorted(os.listdir(src)):
        path = os.path.join(src, entry)
        if entry in ("lib.rs", "main.rs"):
            continue
        if entry.endswith(".rs"):
            mods.setdefault(entry[:-3], []).append(path)
        elif os.path.isdir(path):
            for root, _, files in os.walk(path):
                for f in files:
                    if f.endswith(".rs"):
                        mods.setdefault(entry, []).append(os.path.join(root, f))
    return mods


def strip_comments(text):
    return re.sub(r"//[^\n]*", "", text)


def crate_graph(src):
    mods = modules(src)
    edges = {m: set() for m in mods}
    for m, files in mods.items():
        for f in files:
            with open(f, encoding="utf-8") as fh:
                text = strip_comments(fh.read())
            for ref in CRATE_REF.findall(text):
                if ref in mods and ref != m:
                    edges[m].add(ref)
    return edges


USE_STMT = re.compile(r"\b(?:pub(?:\([a-z]+\))?\s+)?use\s+([^;]+);", re.S)
INLINE_PATH = re.compile(r"\b((?:crate|super|self)(?:::(?:super|[A-Za-z_][A-Za-z0-9_]*))+)")


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e'] (aliases and globs dropped)."""
    tree = re.sub(r"\s+", "", tree)
    out = []

    def walk(prefix, t):
        depth, start, parts = 0, 0, []
        if "{" not in t:
            t = t.split("as")[0] if re.search(r"\bas\b", t) else t
            t = re.sub(r"as[A-Za-z_][A-Za-z0-9_]*$", "", t) if "as_" not in t else t
            out.append(prefix + t)
            return
        i = t.index("{")
        head, body = t[:i], t[i + 1:t.rindex("}")]
        for j, ch in enumerate(body):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(body[start:j])
                start = j + 1
        parts.append(body[start:])
        for part in parts:
            if part and part != "self":
                walk(prefix + head, part)
            elif part == "self":
                out.append((prefix + head).rstrip(":"))

    walk("", tree)
    return [p.rstrip(":*").rstrip(":") for p in out if p]


def module_files(src):
    """Module path (tuple) -> file, for every module file below src (lib.rs/main.rs is ())."""
    mods = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, f), src)[:-3].split(os.sep)
            if rel in (["lib"], ["main"]):
                key = ()
            elif rel[-1] == "mod":
                key = tuple(rel[:-1])
            else:
                key = tuple(rel)
            mods[key] = os.path.join(root, f)
    return mods


def file_graph(src):
    """Edges between the module files of one crate (see --files)."""
    mods = module_files(src)
    texts = {}
    for key, path in mods.items():
        with open(path, encoding="utf-8") as fh:
            text = strip_comments(fh.read())
        cut = re.search(r"#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+\w+\s*\{", text)
        texts[key] = text[:cut.start()] if cut else text
    # Names each module re-exports: name -> the absolute path it stands for.
    reexports = {}
    for key, text in texts.items():
        table = {}
        for m in USE_STMT.finditer(text):
            if not re.match(r"\s*pub", text[m.start():m.start() + 4]):
                continue
            for path in expand_use(m.group(1)):
                absolute = absolute_path(key, path)
                if absolute is not None:
                    table[absolute[-1]] = absolute
        reexports[key] = table

    def resolve(path, seen=0):
        """The module that defines what `path` (absolute, a tuple) names."""
        at = ()
        for i, seg in enumerate(path):
            nxt = at + (seg,)
            if nxt in mods:
                at = nxt
                continue
            target = reexports.get(at, {}).get(seg)
            if target is not None and seen < 8 and target != path[: i + 1]:
                return resolve(target + tuple(path[i + 1:]), seen + 1)
            break
        return at

    edges = {key: set() for key in mods}
    for key, text in texts.items():
        paths = []
        for m in USE_STMT.finditer(text):
            # A re-export (`pub use`) names an item for the module's users and makes no use of
            # it: it is followed when resolving paths, but is no edge of its own.
            if not re.match(r"pub", text[m.start():m.start() + 3]):
                paths += expand_use(m.group(1))
        uses = set(m.span() for m in USE_STMT.finditer(text))
        inline = [m for m in INLINE_PATH.finditer(text) if not any(a <= m.start() < b for a, b in uses)]
        paths += [m.group(1) for m in inline]
        for path in paths:
            absolute = absolute_path(key, path)
            if absolute is None:
                continue
            target = resolve(absolute)
            if target != key and target in mods:
                edges[key].add(target)
    return {"::".join(k) or "crate": {"::".join(t) or "crate" for t in v} for k, v in edges.items()}


def absolute_path(key, path):
    """`crate::a::b` / `super::x` / `self::y` seen in module `key` -> an absolute tuple, or None
    for a path into another crate."""
    segs = path.split("::")
    if segs[0] == "crate":
        return tuple(segs[1:])
    if segs[0] in ("super", "self"):
        at = list(key)
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                if not at:
                    return None
                at.pop()
            segs = segs[1:]
        return tuple(at + segs)
    return None


def public_items(crate_dir):
    count = 0
    for root, _, files in os.walk(os.path.join(crate_dir, "src")):
        for f in files:
            if not f.endswith(".rs"):
                continue
            with open(os.path.join(root, f), encoding="utf-8") as fh:
                in_tests = False
                for line in fh:
                    if re.match(r"^\s*#\[cfg\(test\)\]", line):
                        in_tests = True
                    if not in_tests and PUB_ITEM.match(line):
                        count += 1
    return count


def sccs(edges):
    """Tarjan's strongly connected components."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dot", help="write the module graph of every crate to this Graphviz file")
    ap.add_argument("--check", action="store_true", help="exit 1 when a --acyclic or --only-imported-by rule fails")
    ap.add_argument("--acyclic", action="append", default=[], metavar="CRATE")
    ap.add_argument("--only-imported-by", action="append", default=[], metavar="CRATE:MODULE=ROOT")
    ap.add_argument("--no-crate", action="append", default=[], metavar="CRATE:MODULE=DEP[,DEP]")
    ap.add_argument("--files", action="store_true", help="also check cycles between files, every crate")
    args = ap.parse_args()

    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    os.chdir(root)
    failed = False
    dot = ["digraph tollgate {", "  rankdir=LR; node [shape=box, fontname=monospace];"]
    graphs = {}
    for crate in sorted(os.listdir(CRATES)):
        src = os.path.join(CRATES, crate, "src")
        if not os.path.isfile(os.path.join(src, "lib.rs")):
            continue
        edges = crate_graph(src)
        graphs[crate] = edges
        cycles = sccs(edges)
        print(f"{crate}: {len(edges)} modules, {sum(len(e) for e in edges.values())} edges, "
              f"{public_items(os.path.join(CRATES, crate))} public items, "
              f"{'no cycle' if not cycles else str(len(cycles)) + ' cycle(s)'}")
        for c in cycles:
            print(f"  cycle: {' <-> '.join(c)}")
        if crate in args.acyclic and cycles:
            failed = True
        dot.append(f'  subgraph "cluster_{crate}" {{ label="{crate}";')
        for m in sorted(edges):
            dot.append(f'    "{crate}::{m}" [label="{m}"];')
        for m in sorted(edges):
            for t in sorted(edges[m]):
                dot.append(f'    "{crate}::{m}" -> "{crate}::{t}";')
        dot.append("  }")
    dot.append("}")

    if args.files:
        for crate in sorted(os.listdir(CRATES)):
            src = os.path.join(CRATES, crate, "src")
            if not os.path.isdir(src):
                continue
            edges = file_graph(src)
            cycles = sccs(edges)
            print(f"{crate} (files): {len(edges)} files, {sum(len(e) for e in edges.values())} edges, "
                  f"{'no cycle' if not cycles else str(len(cycles)) + ' cycle(s)'}")
            for c in cycles:
                print(f"  cycle: {' <-> '.join(c)}")
            if cycles and crate in args.acyclic:
                failed = True

    for rule in args.only_imported_by:
        target, _, allowed = rule.partition("=")
        crate, _, module = target.partition(":")
        importers = sorted(m for m, e in graphs.get(crate, {}).items() if module in e)
        others = [m for m in importers if m != allowed]
        print(f"{crate}::{module} imported by: {', '.join(importers) or 'nothing'}")
        if others:
            failed = True

    for rule in args.no_crate:
        target, _, deps = rule.partition("=")
        crate, _, module = target.partition(":")
        src = os.path.join(CRATES, crate, "src")
        files = [os.path.join(src, module + ".rs")]
        folder = os.path.join(src, module)
        if os.path.isdir(folder):
            files += [os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs if f.endswith(".rs")]
        hits = []
        for path in files:
            if not os.path.isfile(path):
                continue
            with open(path, encoding="utf-8") as fh:
                text = strip_comments(fh.read())
            for dep in deps.split(","):
                if re.search(r"\b" + re.escape(dep) + r"::|\buse\s+" + re.escape(dep) + r"\b", text):
                    hits.append(f"{os.path.relpath(path)} names {dep}")
        print(f"{crate}::{module} names none of {deps}" if not hits else "\n".join(hits))
        if hits:
            failed = True

    if args.dot:
        with open(args.dot, "w", encoding="utf-8") as fh:
            fh.write("\n".join(dot) + "\n")
        print(f"wrote {args.dot}")
    if args.check and failed:
        print("modgraph: a --acyclic, --only-imported-by or --no-crate rule failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
