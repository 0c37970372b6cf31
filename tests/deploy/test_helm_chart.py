"""deploy/helm/textgen: lints, renders with default and with every option on, passes
kubeconform against the Kubernetes schemas offline, and the rendered objects carry what a GPU
deployment needs (GPU limits, /dev/shm, probes, a drain that fits the grace period, non-root)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kube_schemas import KUBERNETES_VERSION, write_standalone_schemas
from launcher.options import OPTIONS
from launcher.settings import parse_settings
from metrics_doc import documented_metrics
from deploy_tools import REPO_ROOT, check_tool, run_tool

CHART = REPO_ROOT / "deploy" / "helm" / "textgen"
ALL_ON = Path(__file__).parent / "helm-values-all-on.yaml"
RELEASE = "textgen"
# kubeconform has no schema for the Prometheus Operator's CRD; its fields are asserted below.
CRD_KINDS = {"ServiceMonitor"}
RENDERINGS = {
    "default": [],
    "all-on": ["-f", str(ALL_ON)],
    "existing-secret-and-claim": ["--set", "hfToken.existingSecret=hf-credentials",
                                  "--set", "hfToken.existingSecretKey=token",
                                  "--set", "cache.existingClaim=model-cache"],
    "no-cache": ["--set", "cache.enabled=false", "--set", "jsonLogs=false"],
}


def render(*args: str) -> str:
    return check_tool("helm", "template", RELEASE, str(CHART),
                      "--kube-version", KUBERNETES_VERSION, *args)


def objects(manifest: str) -> dict[str, dict]:
    """Rendered objects by kind (the chart renders at most one of each)."""
    by_kind: dict[str, dict] = {}
    for document in yaml.safe_load_all(manifest):
        if document:
            assert document["kind"] not in by_kind, f"two {document['kind']} objects"
            by_kind[document["kind"]] = document
    return by_kind


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    return {name: render(*args) for name, args in RENDERINGS.items()}


@pytest.fixture(scope="module")
def schema_location(rendered, tmp_path_factory) -> str:
    kinds = {(document["kind"], document["apiVersion"]) for manifest in rendered.values()
             for document in yaml.safe_load_all(manifest)
             if document and document["kind"] not in CRD_KINDS}
    kinds.add(("Deployment", "apps/v1"))  # for the negative check
    return write_standalone_schemas(kinds, tmp_path_factory.mktemp("schemas"))


def kubeconform(manifest: str, schema_location: str):
    return run_tool("kubeconform", "-strict", "-summary", "-kubernetes-version",
                    KUBERNETES_VERSION, "-schema-location", schema_location,
                    "-skip", ",".join(sorted(CRD_KINDS)), "-", input=manifest)


def _container(deployment: dict) -> dict:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _env(container: dict) -> dict[str, dict]:
    return {entry["name"]: entry for entry in container["env"]}


@pytest.mark.parametrize("values", [[], ["-f", str(ALL_ON)]], ids=["default", "all-on"])
def test_helm_lint(values):
    output = check_tool("helm", "lint", "--strict", str(CHART), *values)
    assert "0 chart(s) failed" in output


@pytest.mark.parametrize("name", RENDERINGS)
def test_rendered_manifests_pass_kubeconform(rendered, schema_location, name):
    result = kubeconform(rendered[name], schema_location)
    assert result.returncode == 0, result.stdout + result.stderr
    by_kind = objects(rendered[name])
    validated = len(set(by_kind) - CRD_KINDS)
    skipped = len(set(by_kind) & CRD_KINDS)
    assert (f"Valid: {validated}, Invalid: 0, Errors: 0, Skipped: {skipped}"
            in result.stdout), result.stdout


def test_kubeconform_rejects_an_unknown_field(schema_location):
    bad = yaml.safe_dump({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
            "metadata": {"labels": {"a": "b"}},
            "spec": {"containers": [{"name": "c", "image": "i", "gpus": 1}]}}}})
    result = kubeconform(bad, schema_location)
    assert result.returncode != 0
    assert "additional properties 'gpus' not allowed" in result.stdout


def test_default_rendering_has_the_expected_objects(rendered):
    assert set(objects(rendered["default"])) == {"Deployment", "Service",
                                                 "PersistentVolumeClaim"}
    assert set(objects(rendered["all-on"])) == {
        "Deployment", "Service", "PersistentVolumeClaim", "Secret", "ServiceMonitor",
        "HorizontalPodAutoscaler"}


@pytest.mark.parametrize("name", RENDERINGS)
def test_gpu_shm_cache_and_security(rendered, name):
    deployment = objects(rendered[name])["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    container = _container(deployment)
    num_shard = int(_env(container)["NUM_SHARD"]["value"])
    assert container["resources"]["limits"]["nvidia.com/gpu"] == num_shard
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert "/data" in mounts
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert any(toleration["key"] == "nvidia.com/gpu" for toleration in pod["tolerations"])


def test_all_on_rendering_uses_every_option(rendered):
    by_kind = objects(rendered["all-on"])
    pod = by_kind["Deployment"]["spec"]["template"]["spec"]
    container = _container(by_kind["Deployment"])
    env = _env(container)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert "nodeAffinity" in pod["affinity"]
    assert container["args"] == ["--max-batch-prefill-tokens", "8192"]
    assert env["OTLP_ENDPOINT"]["value"] == "http://otel-collector.observability:4317"
    assert env["MAX_TOTAL_TOKENS"]["value"] == "4096"
    assert "replicas" not in by_kind["Deployment"]["spec"], "the HPA owns the replica count"
    claim = by_kind["PersistentVolumeClaim"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes["cache"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert volumes["shm"]["emptyDir"]["sizeLimit"] == "8Gi"


@pytest.mark.parametrize("name", RENDERINGS)
def test_probes_hit_health_on_the_served_port(rendered, name):
    container = _container(objects(rendered[name])["Deployment"])
    (port,) = container["ports"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": port["name"]}, probe
    startup = container["startupProbe"]
    # Downloading and loading a model takes minutes: the startup probe must allow them.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600


@pytest.mark.parametrize("name", RENDERINGS)
def test_launcher_accepts_the_chart_environment(rendered, name):
    """The env the chart sets is read by the real launcher's settings parser, and agrees with
    the container port and the grace period."""
    deployment = objects(rendered[name])["Deployment"]
    container = _container(deployment)
    env = {key: entry["value"] for key, entry in _env(container).items() if "value" in entry}
    settings = parse_settings(container.get("args", []), env)
    assert settings.port == container["ports"][0]["containerPort"]
    assert settings.hostname == "0.0.0.0"
    assert settings.model_id == env["MODEL_ID"]
    assert settings.json_output is (name != "no-cache")
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > settings.graceful_termination_timeout + float(pre_stop[1]), (
        "Kubernetes would kill the pod before the router finishes draining")


def test_every_variable_the_chart_sets_is_read_by_the_launcher(rendered):
    """A renamed flag would leave the chart setting a variable nobody reads."""
    env_twins = {name for option in OPTIONS for name in option.envs}
    container = _container(objects(rendered["all-on"])["Deployment"])
    user_supplied = {"POD_NAME"}  # from helm-values-all-on.yaml's extraEnv
    hub_variables = {"HF_TOKEN"}  # read by the launcher's Hub access, not a flag
    chart_set = set(_env(container)) - user_supplied - hub_variables
    assert chart_set - {"MAX_TOTAL_TOKENS", "MAX_CONCURRENT_REQUESTS"} >= {
        "MODEL_ID", "NUM_SHARD", "PORT", "HOSTNAME", "GRACEFUL_TERMINATION_TIMEOUT",
        "OTLP_ENDPOINT"}
    assert chart_set <= env_twins, f"not launcher env twins: {sorted(chart_set - env_twins)}"


def test_hf_token_comes_from_the_chart_secret(rendered):
    by_kind = objects(rendered["all-on"])
    token = _env(_container(by_kind["Deployment"]))["HF_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert token["name"] == by_kind["Secret"]["metadata"]["name"]
    assert token["key"] in by_kind["Secret"]["data"]


def test_existing_secret_and_claim_are_used_not_created(rendered):
    by_kind = objects(rendered["existing-secret-and-claim"])
    assert "Secret" not in by_kind and "PersistentVolumeClaim" not in by_kind
    container = _container(by_kind["Deployment"])
    assert _env(container)["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "hf-credentials", "key": "token"}
    volumes = {v["name"]: v for v in by_kind["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    assert volumes["cache"]["persistentVolumeClaim"]["claimName"] == "model-cache"


def test_without_a_cache_the_hub_cache_is_an_empty_dir(rendered):
    by_kind = objects(rendered["no-cache"])
    assert "PersistentVolumeClaim" not in by_kind
    volumes = {v["name"]: v for v in by_kind["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    assert volumes["cache"] == {"name": "cache", "emptyDir": {}}


def test_a_grace_period_shorter_than_the_drain_is_refused():
    result = run_tool("helm", "template", RELEASE, str(CHART), "--kube-version",
                      KUBERNETES_VERSION, "--set", "drainTimeoutSeconds=90",
                      "--set", "terminationGracePeriodSeconds=60")
    assert result.returncode != 0
    assert "must exceed preStopSleepSeconds + drainTimeoutSeconds" in result.stderr


def test_service_and_service_monitor_select_the_pods(rendered):
    by_kind = objects(rendered["all-on"])
    pod_labels = by_kind["Deployment"]["spec"]["template"]["metadata"]["labels"]
    service = by_kind["Service"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    monitor = by_kind["ServiceMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert endpoint["path"] == "/metrics"


def test_hpa_scales_the_deployment_on_documented_queue_depth(rendered):
    by_kind = objects(rendered["all-on"])
    hpa = by_kind["HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": by_kind["Deployment"]["metadata"]["name"]}
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    name = metric["pods"]["metric"]["name"]
    assert name == "textgen_waiting_requests"
    assert documented_metrics()[name] == "gauge"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
