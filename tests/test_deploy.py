"""Deployment files agree with each other (no Docker daemon or cluster here: the files are read, not run)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

ROOT = Path(__file__).resolve().parents[1]


def final_stage() -> list[tuple[str, str]]:
    """The Dockerfile's last stage as (INSTRUCTION, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    instructions = [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]
    last_from = max(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    return instructions[last_from:]


def image_env(stage: list[tuple[str, str]]) -> dict[str, str]:
    return dict(pair.split("=", 1) for op, args in stage if op == "ENV" for pair in shlex.split(args))


def test_dockerfile_env_healthcheck_and_user_agree() -> None:
    """Keel listens on all interfaces at KEEL_PORT, which EXPOSE and the HEALTHCHECK use; it runs as
    uid 10001; tiktoken's encodings are fetched, as root, into the TIKTOKEN_CACHE_DIR the image sets;
    a baked model is made readable by every user."""
    stage = final_stage()
    env = image_env(stage)
    ops = [op for op, _ in stage]
    assert env["KEEL_HOST"] == "0.0.0.0"
    port = env["KEEL_PORT"]
    assert [args for op, args in stage if op == "EXPOSE"] == [port]
    healthcheck = next(args for op, args in stage if op == "HEALTHCHECK")
    assert "http://127.0.0.1:%s/healthz" in healthcheck and f"os.environ.get('KEEL_PORT', '{port}')" in healthcheck
    assert any(op == "RUN" and "useradd" in args and "--uid 10001 keel" in args for op, args in stage)
    assert [args for op, args in stage if op == "USER"] == ["keel"]
    user_at = ops.index("USER")
    tiktoken_at = next(i for i, (op, args) in enumerate(stage) if op == "RUN" and "tiktoken.get_encoding" in args)
    assert "'o200k_base'" in stage[tiktoken_at][1] and "'cl100k_base'" in stage[tiktoken_at][1]
    cache_env_at = next(i for i, (op, args) in enumerate(stage) if op == "ENV" and "TIKTOKEN_CACHE_DIR=" in args)
    assert cache_env_at < tiktoken_at < user_at
    fetch_at = next(i for i, (op, args) in enumerate(stage) if op == "RUN" and "keel fetch-model" in args)
    fetch = stage[fetch_at][1]
    model_dir = re.search(r"keel fetch-model (\S+)", fetch)
    assert model_dir and fetch_at < user_at
    assert re.search(r"chmod -R a\+rX (/opt/keel|" + re.escape(model_dir.group(1)) + ")", fetch)


def manifests() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def test_kubernetes_store_is_a_service_of_the_manifests() -> None:
    """The ConfigMap's Redis URL names a Service in the manifests, on its port, selecting a Deployment
    that runs Redis on the Service's target port."""
    docs = manifests()
    config = yaml.safe_load(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["keel.yaml"])
    url = urlsplit(config["store"]["url"])
    assert url.scheme == "redis"
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == url.hostname)
    service_port = next(p for p in service["spec"]["ports"] if p["port"] == (url.port or 6379))
    selector = service["spec"]["selector"]
    backend = next(d for d in docs if d["kind"] == "Deployment"
                   and selector.items() <= d["spec"]["template"]["metadata"]["labels"].items())
    ports = [p for c in backend["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])]
    assert any(service_port["targetPort"] in (p.get("name"), p["containerPort"]) for p in ports)
    assert any("redis" in c["image"] for c in backend["spec"]["template"]["spec"]["containers"])


def test_kubernetes_keel_container_port_and_pull_policy() -> None:
    """The probes and containerPort are the port Keel listens on in the image (KEEL_PORT), and no
    container pulls on every start."""
    docs = manifests()
    deployment = next(d for d in docs if d["kind"] == "Deployment" and any(
        c["name"] == "keel" for c in d["spec"]["template"]["spec"]["containers"]))
    keel = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "keel")
    env = {e["name"]: e.get("value") for e in keel.get("env", [])}
    port = int(env.get("KEEL_PORT") or image_env(final_stage())["KEEL_PORT"])
    assert [p["containerPort"] for p in keel["ports"]] == [port]
    assert keel["livenessProbe"]["httpGet"]["port"] == keel["readinessProbe"]["httpGet"]["port"] == port
    assert keel["imagePullPolicy"] == "IfNotPresent"
    containers = [c for d in docs if d["kind"] == "Deployment" for c in d["spec"]["template"]["spec"]["containers"]]
    assert all(c.get("imagePullPolicy") != "Always" for c in containers)
