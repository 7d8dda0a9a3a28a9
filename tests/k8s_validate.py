"""Kubernetes resources (YAML documents) checked against the API's JSON schemas, offline.

Built-in kinds are validated by ``kubernetes-validate`` (the API's schemas bundled in the
package, strict: an unknown field is an error, as ``kubectl apply`` with server-side field
validation refuses it); custom resources (a ServiceMonitor, a PrometheusRule, Strimzi's
KafkaTopic and KafkaUser) by the ``openAPIV3Schema`` of their CustomResourceDefinition,
made strict the same way: an object schema that lists its properties and does not keep
unknown fields (``x-kubernetes-preserve-unknown-fields``) refuses any other. Every
resource's metadata is checked as Kubernetes would (names, labels).

    crds = CrdSchemas.from_files(Path(folder).glob("*.yaml"))
    problems(documents(text), crds)   # [] when every resource is valid

Used by the Helm chart's test (tests/unit/deploy/test_helm_chart.py); the Strimzi manifest's
test (tests/unit/deploy/test_strimzi_manifest.py) checks its resources' metadata with
``metadata_problems``, their specs with Strimzi's own schemas (scripts/strimzi_schemas.sh).
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest the
# package knows: a resource must be valid on both.
K8S_VERSIONS = ("1.27", kubernetes_validate.latest_version())

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(rf"^{_LABEL}$")
_DNS1123_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
# kinds whose name is a DNS label (it becomes a host name): Kubernetes refuses longer ones
_DNS_LABEL_KINDS = {"Service", "StatefulSet"}


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """YAML's safe loader (libyaml's when there), reading a lone ``=`` (the value key type
    of YAML 1.1, which CRDs' enums use) as the string it is."""


_Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: str(node.value))


def documents(text: str) -> list[dict[str, Any]]:
    """The non-empty YAML documents of a multi-document text (``helm template``'s)."""
    return [d for d in yaml.load_all(text, Loader=_Loader) if d]


@dataclass
class CrdSchemas:
    """The strict ``openAPIV3Schema`` of each served version of some CRDs, by
    ``(apiVersion, kind)``."""

    schemas: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_files(cls, paths: Iterable[Path]) -> CrdSchemas:
        found = cls()
        for path in paths:
            for doc in documents(Path(path).read_text()):
                if doc.get("kind") == "CustomResourceDefinition":
                    found.add(doc)
        return found

    def add(self, crd: dict[str, Any]) -> None:
        spec = crd["spec"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            schema = version["schema"]["openAPIV3Schema"]
            key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
            self.schemas[key] = strict(schema)

    def get(self, api_version: str, kind: str) -> dict[str, Any] | None:
        return self.schemas.get((api_version, kind))


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of a CRD schema in which every object that lists its properties refuses
    others (what the API server's strict field validation does), except where the schema
    keeps unknown fields or names a schema for them."""
    out = copy.deepcopy(schema)

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(out)
    return out


def _where(doc: dict[str, Any]) -> str:
    name = (doc.get("metadata") or {}).get("name", "?")
    return f"{doc.get('kind', '?')}/{name}"


def _path(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "(top)"


def _metadata_problems(doc: dict[str, Any]) -> list[str]:
    meta = doc.get("metadata") or {}
    name = meta.get("name")
    out = []
    if not isinstance(name, str) or not name:
        return ["metadata.name: missing"]
    if doc.get("kind") in _DNS_LABEL_KINDS:
        if len(name) > 63 or not _DNS1123_LABEL.match(name):
            out.append(f"metadata.name: {name!r} is not a DNS label (63 characters, a-z0-9-)")
    elif len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
        out.append(f"metadata.name: {name!r} is not a DNS subdomain name")
    for where, labels in (("metadata.labels", meta.get("labels") or {}),
                          ("template labels", _template_labels(doc))):
        for key, value in labels.items():
            prefix, _, short = str(key).rpartition("/")
            if (not short or len(short) > 63 or not _LABEL_NAME.match(short)
                    or (prefix and not _DNS1123_SUBDOMAIN.match(prefix))):
                out.append(f"{where}: bad label key {key!r}")
            if not isinstance(value, str) or len(value) > 63 or not _LABEL_NAME.match(value):
                out.append(f"{where}: bad value {value!r} of label {key!r}")
    return out


def _template_labels(doc: dict[str, Any]) -> dict[str, Any]:
    template = (doc.get("spec") or {}).get("template") or {}
    return (template.get("metadata") or {}).get("labels") or {}


def problems(docs: Iterable[dict[str, Any]], crds: CrdSchemas | None = None,
             versions: Iterable[str] = K8S_VERSIONS) -> list[str]:
    """One line per finding, ``Kind/name: path: message``; [] when every document is a
    valid resource. A kind with no schema (neither built in nor among ``crds``) is a
    finding too: nothing goes unchecked."""
    out: list[str] = []
    crds = crds or CrdSchemas()
    for doc in docs:
        where = _where(doc)
        if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
            out.append(f"{where}: not a Kubernetes resource (apiVersion, kind)")
            continue
        schema = crds.get(doc["apiVersion"], doc["kind"])
        if schema is not None:
            out += metadata_problems(doc, versions)
            validator = jsonschema.Draft7Validator(schema)
            # a path mixes list indices and keys: ordered by its text
            out += [f"{where}: {_path(e)}: {e.message}"
                    for e in sorted(validator.iter_errors(doc), key=lambda e: str(list(e.path)))]
            continue
        out += [f"{where}: {p}" for p in _metadata_problems(doc)]
        out += _builtin(where, doc, versions)
    return out


def metadata_problems(doc: dict[str, Any], versions: Iterable[str] = K8S_VERSIONS) -> list[str]:
    """A custom resource's metadata checked as Kubernetes checks it (its CRD's schema
    leaves metadata open): names and labels, and the fields of ObjectMeta as a built-in
    kind's; one line per finding, ``Kind/name: path: message``."""
    where = _where(doc)
    out = [f"{where}: {p}" for p in _metadata_problems(doc)]
    return out + _builtin(where, {"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": doc.get("metadata")}, versions)


def _builtin(where: str, doc: dict[str, Any], versions: Iterable[str]) -> list[str]:
    out = []
    for version in versions:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            out.append(f"{where}: {_path(exc)}: {exc.message} (Kubernetes {exc.version})")
        except kubernetes_validate.SchemaNotFoundError as exc:
            out.append(f"{where}: no schema: {exc.message}")
    return sorted(set(out))


def required(what: str, how: str = "scripts/bootstrap.sh --test installs it") -> None:
    """A tool the tests need is missing: fail where the whole suite is required (the test
    command sets MEMSTREAM_REQUIRE_TOOLS=1 for its unit run, after bootstrap installed the
    tools), else skip."""
    wanted = (os.environ.get("MEMSTREAM_REQUIRE_INTEGRATION"),
              os.environ.get("MEMSTREAM_REQUIRE_TOOLS"))
    if "1" in wanted:
        pytest.fail(f"{what} ({how})")
    pytest.skip(what)
