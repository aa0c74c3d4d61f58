"""Validation of a set of manifests and scripts: each custom resource against
its CRD in strict mode (schema.py), then the rules (rules.py, slurm.py).
`torus-launch check` and render's self-check both call check_sources().
"""

from __future__ import annotations

import os
from typing import Iterable, List, Tuple

import yaml

from .rules import CORE_KINDS, RULES, Doc, Expect, Problem, Report, check_consistency
from .schema import YAML_LOADER, CrdSchemas, schema_errors
from .slurm import check_script

_SCHEMAS = CrdSchemas()


def is_script(name: str, text: str) -> bool:
    return not name.endswith((".yaml", ".yml", ".json")) and (text.startswith("#!") or "#SBATCH" in text)


def parse_documents(name: str, text: str) -> Tuple[List[Doc], List[Problem]]:
    docs, problems = [], []
    try:
        for i, obj in enumerate(yaml.load_all(text, Loader=YAML_LOADER)):
            if obj is None:
                continue
            if not isinstance(obj, dict):
                problems.append(Problem(name, f"document/#{i + 1}", "", "not a mapping"))
                continue
            docs.append(Doc(name, i, obj))
    except yaml.YAMLError as e:
        problems.append(Problem(name, "yaml", "", f"cannot parse: {e}".replace("\n", " ")))
    return docs, problems


def check_documents(docs: List[Doc], expect: Expect) -> List[Problem]:
    r = Report(expect)
    for doc in docs:
        api, kind = str(doc.obj.get("apiVersion", "")), doc.kind
        if not doc.name:
            r.add(doc, ["metadata", "name"], "missing")
        if kind in CORE_KINDS:
            pass
        elif not _SCHEMAS.knows(api, kind):
            r.add(doc, ["kind"], f"no CRD or rules for {api} {kind}: cannot validate it")
            continue
        else:
            validator = _SCHEMAS.validator(api, kind)
            if validator is None:
                r.add(doc, ["apiVersion"], f"{api} is not served by the {kind} CRD (served: "
                                           f"{', '.join(_SCHEMAS.served_versions(api, kind))})")
                continue
            for path, message in schema_errors(validator, doc.obj, kind):
                r.add(doc, path, message)
        rule = RULES.get(kind)
        if rule is not None:
            rule(r, doc, docs)
    check_consistency(r)
    return r.problems


def check_sources(sources: Iterable[Tuple[str, str]], expect: Expect) -> List[Problem]:
    """Problems of (name, text) pairs; the manifests among them are checked as one set (zones, references)."""
    docs: List[Doc] = []
    problems: List[Problem] = []
    for name, text in sources:
        if is_script(name, text):
            problems += check_script(name, text, expect)
        else:
            d, p = parse_documents(name, text)
            docs += d
            problems += p
    return problems + check_documents(docs, expect)


def read_sources(paths: List[str]) -> List[Tuple[str, str]]:
    """(path, text) of each file; a directory stands for the files in it. Raises OSError."""
    out = []
    for p in paths:
        if os.path.isdir(p):
            for n in sorted(os.listdir(p)):
                f = os.path.join(p, n)
                if os.path.isfile(f):
                    out.append((f, open(f, encoding="utf-8").read()))
        else:
            out.append((p, open(p, encoding="utf-8").read()))
    return out
