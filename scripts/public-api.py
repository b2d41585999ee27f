#!/usr/bin/env python3
"""The public API of the workspace's library crates, as a sorted listing of item paths.

For each crate it asks rustdoc for its JSON description (rustdoc's JSON output is not stable
yet: RUSTC_BOOTSTRAP=1 lets the stable toolchain write it) and walks what a user of the crate
can name from its root: public modules, re-exports, structs with their public fields, enums
with their variants, traits with their items, functions, constants, statics, type aliases,
macros and the inherent methods of public types. Trait implementations are not listed.

    scripts/public-api.py                  print every crate's listing
    scripts/public-api.py --check DIR      compare with DIR/<crate>.txt; exit 1 on a difference
    scripts/public-api.py --write DIR      write DIR/<crate>.txt

A change of the public API is then a change of a file under review (api/), and the suite fails
when the code and the listing disagree.
"""

import argparse
import difflib
import json
import os
import subprocess
import sys

CRATES = ["tollgate-core", "tollgate-redis", "tollgate-server", "tollgate-tower", "tollgate-proto"]


def rustdoc_json(crate):
    env = dict(os.environ, RUSTC_BOOTSTRAP="1")
    subprocess.run(
        ["cargo", "rustdoc", "-p", crate, "--lib", "--locked", "-q", "--",
         "-Z", "unstable-options", "--output-format", "json"],
        check=True, env=env)
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    with open(os.path.join(target, "doc", crate.replace("-", "_") + ".json")) as f:
        return json.load(f)


def listing(doc):
    index = doc["index"]
    root = index[str(doc["root"])]
    out = set()
    seen = set()

    def kind_of(item):
        (kind,) = item["inner"].keys()
        return kind, item["inner"][kind]

    def public(item):
        return item.get("visibility") == "public"

    def methods(path, impl_ids):
        for impl_id in impl_ids:
            impl = index.get(str(impl_id))
            if impl is None:
                continue
            _, inner = kind_of(impl)
            if inner.get("trait") is not None or inner.get("blanket_impl") is not None:
                continue
            for m in inner.get("items", []):
                mi = index.get(str(m))
                if mi and public(mi) and mi.get("name"):
                    k, _ = kind_of(mi)
                    out.add(f"{path}::{mi['name']} ({k})")

    def walk(item_id, path):
        item = index.get(str(item_id))
        if item is None:
            # An item of another crate re-exported: listed by name only.
            out.add(f"{path} (re-export)")
            return
        key = (str(item_id), path)
        if key in seen:
            return
        seen.add(key)
        kind, inner = kind_of(item)
        if kind == "module":
            for child in inner["items"]:
                ci = index.get(str(child))
                if ci is None or not public(ci):
                    continue
                ck, cinner = kind_of(ci)
                if ck == "use":
                    if cinner.get("is_glob"):
                        target = cinner.get("id")
                        if target is not None and str(target) in index:
                            walk(target, path)
                        else:
                            out.add(f"{path}::* (glob re-export of {cinner['source']})")
                        continue
                    name = cinner["name"]
                    target = cinner.get("id")
                    if target is None or str(target) not in index:
                        out.add(f"{path}::{name} (re-export of {cinner['source']})")
                    else:
                        walk(target, f"{path}::{name}")
                    continue
                if ci.get("name") is None:
                    continue
                walk(child, f"{path}::{ci['name']}")
            if path.count("::") > 0:
                out.add(f"{path} (module)")
            return
        out.add(f"{path} ({kind})")
        if kind == "struct":
            sk = inner["kind"]
            fields = []
            if isinstance(sk, dict) and "plain" in sk:
                fields = sk["plain"]["fields"]
            elif isinstance(sk, dict) and "tuple" in sk:
                fields = [f for f in sk["tuple"] if f is not None]
            for fid in fields:
                fi = index.get(str(fid))
                if fi and public(fi):
                    out.add(f"{path}::{fi['name']} (field)")
            methods(path, inner.get("impls", []))
        elif kind == "enum":
            for vid in inner["variants"]:
                vi = index.get(str(vid))
                if vi:
                    out.add(f"{path}::{vi['name']} (variant)")
            methods(path, inner.get("impls", []))
        elif kind == "union":
            methods(path, inner.get("impls", []))
        elif kind == "trait":
            for tid in inner["items"]:
                ti = index.get(str(tid))
                if ti:
                    k, _ = kind_of(ti)
                    out.add(f"{path}::{ti['name']} ({k})")

    walk(doc["root"], root["name"])
    return sorted(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--check", metavar="DIR")
    group.add_argument("--write", metavar="DIR")
    ap.add_argument("crates", nargs="*", default=CRATES)
    args = ap.parse_args()
    failed = False
    for crate in args.crates:
        lines = listing(rustdoc_json(crate))
        text = "".join(line + "\n" for line in lines)
        if args.write:
            os.makedirs(args.write, exist_ok=True)
            with open(os.path.join(args.write, crate + ".txt"), "w") as f:
                f.write(text)
            print(f"{crate}: {len(lines)} public items -> {args.write}/{crate}.txt")
        elif args.check:
            path = os.path.join(args.check, crate + ".txt")
            try:
                with open(path) as f:
                    want = f.read()
            except FileNotFoundError:
                want = ""
            if want != text:
                failed = True
                sys.stdout.writelines(difflib.unified_diff(
                    want.splitlines(True), text.splitlines(True), path, f"{crate} (the code)"))
                print(f"{crate}: the public API differs from {path}: if the change is meant, "
                      f"run scripts/public-api.py --write {args.check} and commit it")
            else:
                print(f"{crate}: {len(lines)} public items, as {path} lists them")
        else:
            sys.stdout.write(text)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
