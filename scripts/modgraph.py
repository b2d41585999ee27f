#!/usr/bin/env python3
"""Module dependency picture of the workspace's library crates.

For each crate under crates/ it reads the top-level modules of src/ (a file `src/x.rs` or a
folder `src/x/`), finds which other top-level modules each one names (`crate::y`, `super::y` from
a top-level file, `use y::` inside lib.rs does not count), and prints:

- the edges, as a Graphviz `dot` file (`--dot FILE`, render with `dot -Tsvg FILE`);
- the module cycles (strongly connected components larger than one module);
- the number of public items per crate: `pub` fn/struct/enum/trait/type/const/static/mod/use
  declarations, not `pub(crate)` or `pub(super)` ones (a text count, close to what rustdoc shows).

`--check` exits 1 when a crate named with `--acyclic CRATE` has a cycle, when a module named
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
