"""tests/k8s_validate.py reports every finding, in a stable order, whatever the keys."""

from __future__ import annotations

import pytest

from tests.k8s_validate import CrdSchemas, problems

pytestmark = pytest.mark.unit

CRD = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
       "spec": {"group": "example.com", "names": {"kind": "Thing"},
                "versions": [{"name": "v1", "served": True, "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {"apiVersion": {"type": "string"},
                                   "kind": {"type": "string"},
                                   "metadata": {"type": "object"},
                                   "spec": {"type": "object",
                                            "additionalProperties": {"type": "string"}}}}}}]}}


def test_findings_under_integer_and_string_keys_are_all_reported():
    """YAML reads `1: x` as an integer key: its finding's path mixes an int with the
    strings of the others', and ordering them must not fail."""
    crds = CrdSchemas()
    crds.add(CRD)
    doc = {"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "a"},
           "spec": {1: 2, "b": 3, "c": "ok"}}
    found = problems([doc], crds)
    assert sorted(found) == ["Thing/a: spec.1: 2 is not of type 'string'",
                     "Thing/a: spec.b: 3 is not of type 'string'"], found
