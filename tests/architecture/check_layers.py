#!/usr/bin/env python3
"""Fails on an include that goes up a layer (docs/architecture.md).

The layers and their order are read from docs/architecture.md (the block
between the "layers: bottom up" and "end layers" markers), so the rule is
written once. Every #include of a file under src/, include/torus/ and
kernels/ is mapped to the layer it names; a file may include its own layer
and the layers below it. Prints each violation as FILE:LINE: A -> B.
"""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
root = os.path.abspath(root)

doc = open(os.path.join(root, "docs", "architecture.md"), encoding="utf-8").read()
block = re.search(r"<!-- layers: bottom up.*?-->\s*```\n(.*?)```\s*<!-- end layers -->", doc, re.S)
if not block:
    sys.exit("docs/architecture.md: no layer list between the markers")
order = [line.split()[0] for line in block.group(1).splitlines() if line.strip()]
rank = {name: i for i, name in enumerate(order)}


def layer_of_file(rel):
    parts = rel.split("/")
    if parts[0] == "kernels":
        return "kernels"
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    if parts[:2] == ["include", "torus"] and len(parts) > 3:
        return parts[2]
    return None


def layer_of_include(inc, own):
    parts = inc.split("/")
    if parts[0] == "torus" and len(parts) > 2:
        return parts[1]
    if parts[0] == "kernels":
        return "kernels"
    if own == "kernels" and parts[0] in ("cpu", "cuda"):
        return "kernels"
    if len(parts) > 1 and parts[0] in rank:
        return parts[0]  # a private header of src/<layer>/
    return None


violations, files, unknown = [], 0, set()
for top in ("src", "include", "kernels"):
    for dirpath, _, names in os.walk(os.path.join(root, top)):
        for name in names:
            if not name.endswith((".h", ".cpp", ".cu", ".cuh")):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            own = layer_of_file(rel)
            if own is None:
                continue
            if own not in rank:
                unknown.add(own)
                continue
            files += 1
            with open(path, encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                    if not m:
                        continue
                    target = layer_of_include(m.group(1), own)
                    if target is None or target == own:
                        continue
                    if target not in rank:
                        unknown.add(target)
                    elif rank[target] > rank[own]:
                        violations.append(f"{rel}:{lineno}: {own} -> {target} ({m.group(1)})")

for v in violations:
    print(v)
if unknown:
    print("folders that docs/architecture.md does not place: " + ", ".join(sorted(unknown)))
print(f"{files} files checked against {len(order)} layers: {len(violations)} upward includes")
if violations or unknown or files == 0:
    sys.exit(1)
