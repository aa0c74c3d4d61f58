"""Strict, offline validation of custom resources against their CRDs.

A CRD's openAPIV3Schema is a *structural* schema: the API server prunes every
field it does not declare, so a typo such as `slotPerWorker` is dropped
without an error and the job runs with the default. To catch that offline we
turn each schema into a JSON schema that rejects unknown fields everywhere,
except where the schema itself keeps them (x-kubernetes-preserve-unknown-
fields), and read the Kubernetes extensions the way the API server does:

- x-kubernetes-int-or-string: an integer or a string;
- nullable: null is allowed besides the declared type;
- x-kubernetes-embedded-resource: apiVersion, kind and metadata are allowed;
- the root's metadata is ObjectMeta (the CRD says only "type: object").

What is NOT evaluated: CEL rules (x-kubernetes-validations), `format`, and
defaults. The explicit rules in rules.py cover the CEL rules that matter for
the objects torus-launch renders.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Dict, Iterator, List, Optional, Tuple

import jsonschema
import yaml

SCHEMA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schemas")
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
# The fields of ObjectMeta that a manifest may set (the rest are set by the server).
OBJECT_META = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "maxLength": 253,
                 "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"},
        "generateName": {"type": "string"},
        "namespace": {"type": "string", "maxLength": 63, "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
        "finalizers": {"type": "array", "items": {"type": "string"}},
        "ownerReferences": {"type": "array", "items": {"type": "object"}},
    },
}
_EMBEDDED = {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": OBJECT_META}
_JUNCTORS = ("allOf", "anyOf", "oneOf")


def strict(schema: Dict[str, Any], in_junctor: bool = False) -> Dict[str, Any]:
    """A copy of a structural schema that rejects undeclared fields (see the module note)."""
    s = {k: v for k, v in schema.items() if k not in ("description", "default", "example")}
    if s.get("x-kubernetes-int-or-string"):
        s.pop("type", None)
        s.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if s.get("nullable") and "type" in s:
        s["type"] = [s["type"], "null"]
    if "properties" in s:
        s["properties"] = {k: strict(v) for k, v in s["properties"].items()}
    if s.get("x-kubernetes-embedded-resource"):
        s["properties"] = {**copy.deepcopy(_EMBEDDED), **s.get("properties", {})}
    if isinstance(s.get("additionalProperties"), dict):
        s["additionalProperties"] = strict(s["additionalProperties"])
    if isinstance(s.get("items"), dict):
        s["items"] = strict(s["items"])
    for j in _JUNCTORS:
        if j in s:
            s[j] = [strict(b, in_junctor=True) for b in s[j]]
    if "not" in s:
        s["not"] = strict(s["not"], in_junctor=True)
    object_typed = s.get("type") == "object" or (isinstance(s.get("type"), list) and "object" in s["type"])
    if (object_typed and not in_junctor and not s.get("x-kubernetes-preserve-unknown-fields")
            and "additionalProperties" not in s):
        # An object with no declared properties keeps nothing on the server: every field is unknown.
        s["additionalProperties"] = False
    return s


class CrdSchemas:
    """The CRDs of a directory, by (apiVersion, kind); loaded on first use."""

    def __init__(self, directory: str = SCHEMA_DIR):
        self.directory = directory
        self._crds: Optional[Dict[Tuple[str, str], Dict[str, Any]]] = None   # (group, kind) -> versions
        self._validators: Dict[Tuple[str, str], jsonschema.Draft4Validator] = {}

    def _load(self) -> Dict[Tuple[str, str], Dict[str, Any]]:
        if self._crds is None:
            self._crds = {}
            for name in sorted(os.listdir(self.directory)):
                if not name.endswith((".yaml", ".yml")):
                    continue
                with open(os.path.join(self.directory, name), encoding="utf-8") as f:
                    for doc in yaml.load_all(f, Loader=YAML_LOADER):
                        if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                            spec = doc["spec"]
                            versions = {v["name"]: v["schema"]["openAPIV3Schema"]
                                        for v in spec["versions"] if v.get("served", True)}
                            self._crds[(spec["group"], spec["names"]["kind"])] = versions
        return self._crds

    def knows(self, api_version: str, kind: str) -> bool:
        group = api_version.split("/")[0] if "/" in api_version else ""
        return (group, kind) in self._load()

    def served_versions(self, api_version: str, kind: str) -> List[str]:
        group = api_version.split("/")[0] if "/" in api_version else ""
        return sorted(self._load().get((group, kind), {}))

    def validator(self, api_version: str, kind: str) -> Optional[jsonschema.Draft4Validator]:
        """The strict validator of a served version, or None when the CRD or version is unknown."""
        key = (api_version, kind)
        if key not in self._validators:
            if "/" not in api_version:
                return None
            group, version = api_version.split("/", 1)
            schema = self._load().get((group, kind), {}).get(version)
            if schema is None:
                return None
            root = strict(schema)
            root.setdefault("properties", {})["metadata"] = OBJECT_META
            self._validators[key] = jsonschema.Draft4Validator(root)
        return self._validators[key]


def field_path(parts) -> str:
    """spec.mpiReplicaSpecs.Worker.replicas, spec.tasks[1].name, metadata.labels."app/x"."""
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif p and all(c.isalnum() or c in "_-" for c in p):
            out += ("." if out else "") + p
        else:
            out += ("." if out else "") + f'"{p}"'
    return out


def schema_errors(validator: jsonschema.Draft4Validator, obj: Any, kind: str) -> Iterator[Tuple[str, str]]:
    """(field path, message) for each violation; an unknown field is named in its own path."""
    for e in sorted(validator.iter_errors(obj), key=lambda e: [str(p) for p in e.absolute_path]):
        parts = list(e.absolute_path)
        if e.validator == "additionalProperties" and e.validator_value is False and isinstance(e.instance, dict):
            known = set(e.schema.get("properties", {}))
            for extra in sorted(k for k in e.instance if k not in known):
                hint = _close(extra, known)
                yield field_path(parts + [extra]), (f"unknown field (not in the {kind} schema; "
                                                    f"the API server would drop it){hint}")
        elif e.validator == "required":
            missing = e.message.split("'")[1] if "'" in e.message else e.message
            yield field_path(parts + [missing]), f"required by the {kind} schema"
        else:
            msg = e.message
            if len(msg) > 200:
                msg = msg[:200] + "..."
            yield field_path(parts), f"{msg} ({e.validator} in the {kind} schema)"


def _close(name: str, known) -> str:
    import difflib
    m = difflib.get_close_matches(name, sorted(known), n=1)
    return f"; did you mean '{m[0]}'?" if m else ""
