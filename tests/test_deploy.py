"""Deployment files, checked offline (no Docker daemon, no cluster): the Dockerfile's user and offline
build, and each Kubernetes form (gateway, sidecar, redis, monitoring) rendered from its
kustomization, validated against the Kubernetes schemas `kubernetes-validate` ships, and held to
the restricted Pod Security Standard."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from proxy.config import parse_config
from proxy.metrics import Metrics

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.30.0"
FORMS = ("gateway", "sidecar", "redis", "monitoring")


def final_stage() -> list[tuple[str, str]]:
    """The Dockerfile's last stage as (INSTRUCTION, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    instructions = [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]
    last_from = max(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    return instructions[last_from:]


def image_env(stage: list[tuple[str, str]]) -> dict[str, str]:
    return dict(pair.split("=", 1) for op, args in stage if op == "ENV" for pair in shlex.split(args))


def test_dockerfile_runs_as_a_numeric_user_and_builds_offline() -> None:
    """Keel listens on all interfaces at KEEL_PORT, which EXPOSE and the HEALTHCHECK use; it runs as
    the numeric uid 10001 (the kubelet verifies runAsNonRoot by number); tiktoken's encodings are
    copied from the build context and only loaded (no RUN fetches anything but pip's packages)."""
    stage = final_stage()
    env = image_env(stage)
    ops = [op for op, _ in stage]
    assert env["KEEL_HOST"] == "0.0.0.0"
    port = env["KEEL_PORT"]
    assert [args for op, args in stage if op == "EXPOSE"] == [port]
    healthcheck = next(args for op, args in stage if op == "HEALTHCHECK")
    assert "http://127.0.0.1:%s/healthz" in healthcheck and f"os.environ.get('KEEL_PORT', '{port}')" in healthcheck
    assert any(op == "RUN" and "useradd" in args and "--uid 10001" in args for op, args in stage)
    assert [args for op, args in stage if op == "USER"] == ["10001:10001"]
    user_at = ops.index("USER")
    copy_at = next(i for i, (op, args) in enumerate(stage) if op == "COPY" and "tiktoken" in args)
    load_at = next(i for i, (op, args) in enumerate(stage) if op == "RUN" and "tiktoken.get_encoding" in args)
    cache_env_at = next(i for i, (op, args) in enumerate(stage) if op == "ENV" and "TIKTOKEN_CACHE_DIR=" in args)
    assert cache_env_at < copy_at < load_at < user_at
    assert "'o200k_base'" in stage[load_at][1] and "'cl100k_base'" in stage[load_at][1]
    assert stage[copy_at][1].split()[-1].rstrip("/") == env["TIKTOKEN_CACHE_DIR"]
    for op, args in stage:
        assert op != "ADD" and not (op == "RUN" and re.search(r"https?://|curl |wget ", args)), args
    fetch = next(args for op, args in stage if op == "RUN" and "keel fetch-model" in args)
    assert re.search(r"chmod -R a\+rX /opt/keel", fetch)


def render(form: str) -> list[dict[str, Any]]:
    """What `kubectl kustomize deploy/kubernetes/<form>` renders, for the subset of Kustomize these
    files use (resources, configMapGenerator from files without a name hash); anything else fails."""
    base = K8S / form
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    assert set(kustomization) <= {"apiVersion", "kind", "resources", "configMapGenerator", "generatorOptions"}
    docs: list[dict[str, Any]] = []
    for resource in kustomization.get("resources", []):
        path = (base / resource).resolve()
        if path.is_dir():
            docs.extend(render(str(path.relative_to(K8S))))
        else:
            docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    for generator in kustomization.get("configMapGenerator", []):
        assert kustomization["generatorOptions"] == {"disableNameSuffixHash": True}
        data = {Path(f).name: (base / f).read_text() for f in generator["files"]}
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}, "data": data})
    return docs


def pod_specs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")]


@pytest.mark.parametrize("form", FORMS)
def test_rendered_manifests_validate(form: str) -> None:
    """Every object against the schema of its kind, strictly (an unknown field is an error)."""
    docs = render(form)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("form", ("gateway", "sidecar", "redis"))
def test_pods_meet_the_restricted_pod_security_standard(form: str) -> None:
    """The restricted profile's rules: non-root with a numeric user, no privilege escalation, every
    capability dropped, the runtime's seccomp profile, no host namespaces or host paths."""
    allowed_volumes = {"configMap", "secret", "emptyDir", "persistentVolumeClaim", "projected", "downwardAPI",
                       "ephemeral", "csi"}
    for spec in pod_specs(render(form)):
        pod = spec.get("securityContext", {})
        assert pod.get("runAsNonRoot") is True and pod["seccompProfile"]["type"] == "RuntimeDefault"
        assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
        assert spec.get("automountServiceAccountToken") is False
        for volume in spec.get("volumes", []):
            assert set(volume) - {"name"} <= allowed_volumes, volume
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            sc = container.get("securityContext", {})
            user = sc.get("runAsUser", pod.get("runAsUser"))
            assert isinstance(user, int) and user > 0, container["name"]
            assert sc.get("runAsNonRoot", True) is True and sc.get("privileged") is not True
            assert sc.get("allowPrivilegeEscalation") is False, container["name"]
            assert sc.get("capabilities", {}).get("drop") == ["ALL"] and not sc["capabilities"].get("add")
            assert sc.get("readOnlyRootFilesystem") is True, container["name"]
            assert sc.get("seccompProfile", pod["seccompProfile"])["type"] in ("RuntimeDefault", "Localhost")
            assert "limits" in container.get("resources", {}) and container.get("imagePullPolicy") != "Always"


def keel_container(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    for doc in docs:
        if doc["kind"] == "Deployment":
            for container in doc["spec"]["template"]["spec"]["containers"]:
                if container["name"] == "keel":
                    return doc, container
    raise AssertionError("no keel container")


@pytest.mark.parametrize("form", ("gateway", "sidecar"))
def test_keel_pods_stop_gently_and_are_probed_within_timeouts(form: str) -> None:
    docs = render(form)
    deployment, keel = keel_container(docs)
    spec = deployment["spec"]["template"]["spec"]
    port = int(image_env(final_stage())["KEEL_PORT"])
    assert [p["containerPort"] for p in keel["ports"]] == [port]
    assert spec["securityContext"]["runAsUser"] == 10001, "the image's numeric user"
    assert keel["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    config = parse_config(yaml.safe_load(next(d for d in docs if d["kind"] == "ConfigMap"
                                               and d["metadata"]["name"] == "keel-config")["data"]["keel.yaml"]))
    pre_stop = int(keel["lifecycle"]["preStop"]["exec"]["command"][1])
    assert spec["terminationGracePeriodSeconds"] > pre_stop + config.server.shutdown_grace_seconds
    for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert keel[probe]["httpGet"] == {"path": path, "port": port}
        assert 1 <= keel[probe]["timeoutSeconds"] <= 2, "a probe never waits on the store: /healthz answers at once"
    assert spec["serviceAccountName"] == "keel" and any(d["kind"] == "ServiceAccount" for d in docs)
    assert spec["topologySpreadConstraints"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == str(port)
    assert any(d["kind"] == "NetworkPolicy" for d in docs)
    # the store: the redis form's Service, the password from the Secret that Redis reads too
    url = urlsplit(config.store.url)
    redis = render("redis")
    service = next(d for d in redis if d["kind"] == "Service" and d["metadata"]["name"] == url.hostname)
    assert any(p["port"] == (url.port or 6379) for p in service["spec"]["ports"])
    env = {e["name"]: e for e in keel.get("env", [])}
    assert env[config.store.password_env]["valueFrom"]["secretKeyRef"]["name"] == "keel-redis-auth"


def test_the_gateway_scales_and_survives_disruption() -> None:
    docs = render("gateway")
    deployment, _ = keel_container(docs)
    kinds = {d["kind"]: d for d in docs}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert kinds["Service"]["spec"]["selector"].items() <= labels.items()
    hpa = kinds["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == deployment["metadata"]["name"] and hpa["minReplicas"] >= 2
    assert kinds["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_redis_is_persistent_authenticated_and_bounded() -> None:
    docs = render("redis")
    statefulset = next(d for d in docs if d["kind"] == "StatefulSet")
    redis = next(c for c in statefulset["spec"]["template"]["spec"]["containers"] if c["name"] == "redis")
    assert "--requirepass" in " ".join(redis["command"])
    assert statefulset["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["keel-redis.conf"]
    assert config == (K8S / "redis" / "keel-redis.conf").read_text()
    settings = dict(line.split(None, 1) for line in config.splitlines() if line and not line.startswith("#"))
    assert settings["maxmemory-policy"] == "volatile-lru" and settings["appendonly"] == "yes"
    maxmemory = int(settings["maxmemory"].removesuffix("mb"))
    limit = int(redis["resources"]["limits"]["memory"].removesuffix("Mi"))
    assert maxmemory <= limit * 0.8, "room under the container's limit for buffers and an AOF rewrite"


def test_alert_rules_name_metrics_keel_serves() -> None:
    rules = yaml.safe_load((K8S / "monitoring" / "keel-alerts.rules.yml").read_text())
    alerts = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
    assert {"KeelStoreDown", "KeelStoreBreakerOpen", "KeelMemoryDeadLetters", "KeelMemoryQueueSlow"} <= set(alerts)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    served = {m.name + suffix for m in Metrics().registry.collect() for suffix in suffixes.get(m.type, ("",))}
    for name, expr in alerts.items():
        for metric in re.findall(r"\b(keel_[a-z_]+)", expr):
            assert metric in served, (name, metric)
