"""deploy/docker-compose.yml and the configs it mounts: the compose file parses, every file it
mounts exists, Prometheus scrapes textgen where compose serves it (and `promtool check config`
accepts the config), Grafana is provisioned with the dashboard, the collector pipeline is
complete and textgen sends its traces there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from launcher.options import OPTIONS
from deploy_tools import REPO_ROOT, check_tool, run_tool

DEPLOY = REPO_ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _mounts(service: dict) -> dict[str, Path]:
    """Container path -> host path for each bind mount (relative to the compose file)."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts[target] = (COMPOSE.parent / source).resolve()
    return mounts


def _port_of(published: list[str], container_port: int) -> bool:
    return any(entry.split(":")[-1] == str(container_port) for entry in published)


def test_compose_runs_the_four_services(compose):
    assert set(compose["services"]) == {"textgen", "prometheus", "grafana", "otel-collector"}
    textgen = compose["services"]["textgen"]
    assert textgen["shm_size"] == "1g"
    assert _port_of(textgen["ports"], 80)
    assert any(volume.endswith(":/data") for volume in textgen["volumes"])
    gpus = textgen["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpus["driver"] == "nvidia" and "gpu" in gpus["capabilities"]


def test_every_mounted_file_exists(compose):
    mounted = [(name, path) for name, service in compose["services"].items()
               for path in _mounts(service).values()]
    assert len(mounted) >= 4
    for name, path in mounted:
        assert path.exists(), f"{name} mounts {path}, which does not exist"
    for volume in (v.split(":")[0] for s in compose["services"].values()
                   for v in s.get("volumes", []) if not v.startswith((".", "/"))):
        assert volume in compose.get("volumes", {}), f"named volume {volume} is not declared"


def test_prometheus_config_passes_promtool():
    output = check_tool("promtool", "check", "config", str(PROMETHEUS_CONFIG))
    assert "SUCCESS" in output


def test_promtool_does_reject_a_broken_config(tmp_path):
    broken = tmp_path / "prometheus.yml"
    broken.write_text("scrape_configs:\n  - job_name: textgen\n    scrape_interval: often\n")
    result = run_tool("promtool", "check", "config", str(broken))
    assert result.returncode != 0


def test_prometheus_scrapes_textgen_where_compose_serves_it(compose):
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "textgen"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    (target,) = job["static_configs"][0]["targets"]
    host, port = target.split(":")
    assert host in compose["services"]
    # PORT=80 inside the image: the compose service serves there.
    assert _port_of(compose["services"][host]["ports"], int(port))
    prometheus = compose["services"]["prometheus"]
    assert _mounts(prometheus)["/etc/prometheus/prometheus.yml"] == PROMETHEUS_CONFIG


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard(compose):
    grafana = _mounts(compose["services"]["grafana"])
    provisioning = grafana["/etc/grafana/provisioning"]
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090" and "prometheus" in compose["services"]
    providers = yaml.safe_load((provisioning / "dashboards" / "textgen.yaml").read_text())
    (provider,) = providers["providers"]
    dashboards_dir = provider["options"]["path"]
    dashboard_files = [path for target, path in grafana.items()
                       if target.startswith(dashboards_dir + "/")]
    assert dashboard_files, f"nothing is mounted under {dashboards_dir}"
    for path in dashboard_files:
        assert json.loads(path.read_text())["uid"] == "textgen-overview"


def test_collector_pipeline_is_complete_and_textgen_exports_to_it(compose):
    collector_service = compose["services"]["otel-collector"]
    (config_path,) = _mounts(collector_service).values()
    config = yaml.safe_load(config_path.read_text())
    pipeline = config["service"]["pipelines"]["traces"]
    for section in ("receivers", "processors", "exporters"):
        for name in pipeline.get(section, []):
            assert name in config[section], f"pipeline uses undefined {section[:-1]} {name}"
    grpc_endpoint = config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    grpc_port = grpc_endpoint.rsplit(":", 1)[1]
    endpoint = compose["services"]["textgen"]["environment"]["OTLP_ENDPOINT"]
    assert endpoint == f"http://otel-collector:{grpc_port}"



def test_textgen_environment_in_compose_is_read_by_the_launcher(compose):
    env_twins = {name for option in OPTIONS for name in option.envs}
    environment = set(compose["services"]["textgen"]["environment"]) - {"HF_TOKEN"}
    assert environment and environment <= env_twins, sorted(environment - env_twins)
