"""The Kubernetes manifests, as `kubectl kustomize` renders each overlay: every object valid against the
Kubernetes schemas (strictly: an unknown field is an error), and the properties a safe deployment rests on."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

K8S = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
OVERLAYS = ["dev", "prod"]
# The oldest Kubernetes the README supports whose schemas the validator ships.
KUBERNETES_VERSION = "1.29"
# Custom resources: their schemas come with their operators, not with Kubernetes. Checked below by hand,
# for the fields these manifests rely on.
CUSTOM_KINDS = {"ScaledObject", "PodMonitor", "PrometheusRule", "Certificate", "Issuer", "Cluster"}
METADATA = [ipaddress.ip_network("169.254.169.254/32"), ipaddress.ip_network("fd00:ec2::254/128")]
POD_KINDS = {"Deployment", "StatefulSet", "Job"}


def render(overlay: str) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        if os.environ.get("CI"):
            pytest.fail("kubectl is needed to render the manifests (kubectl kustomize) and is not installed")
        pytest.skip("kubectl is not installed: the manifests cannot be rendered here")
    out = subprocess.run([kubectl, "kustomize", str(K8S / "overlays" / overlay)], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="module", params=OVERLAYS)
def objects(request: pytest.FixtureRequest) -> list[dict]:
    return render(request.param)


def of_kind(objects: list[dict], *kinds: str) -> list[dict]:
    return [o for o in objects if o["kind"] in kinds]


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def containers(obj: dict) -> list[dict]:
    spec = pod_spec(obj)
    return spec.get("initContainers", []) + spec["containers"]


def test_every_object_is_valid_kubernetes(objects: list[dict]) -> None:
    for obj in objects:
        if obj["kind"] in CUSTOM_KINDS:
            continue
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_custom_resources_name_what_they_act_on(objects: list[dict]) -> None:
    deployments = {o["metadata"]["name"] for o in of_kind(objects, "Deployment")}
    for scaled in of_kind(objects, "ScaledObject"):
        assert scaled["apiVersion"] == "keda.sh/v1alpha1"
        assert scaled["spec"]["scaleTargetRef"]["name"] in deployments
        assert 1 <= scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]
        for trigger in scaled["spec"]["triggers"]:
            # Scaled on work (busy handlers and due messages), never on JetStream's lag, which counts the
            # deferred messages of every live job.
            assert trigger["type"] == "prometheus", scaled["metadata"]["name"]
            assert "vidjobs_messages_in_handling" in trigger["metadata"]["query"]
            assert float(trigger["metadata"]["threshold"]) > 0
    for cert in of_kind(objects, "Certificate"):
        assert cert["apiVersion"] == "cert-manager.io/v1"
        assert cert["spec"]["secretName"] and cert["spec"]["issuerRef"]["name"]
    for kind in ("PodMonitor", "PrometheusRule"):
        for obj in of_kind(objects, kind):
            assert obj["apiVersion"] == "monitoring.coreos.com/v1"


def test_every_deployment_is_ready_on_readyz_and_live_on_healthz(objects: list[dict]) -> None:
    for deployment in of_kind(objects, "Deployment"):
        main = pod_spec(deployment)["containers"][0]
        assert main["readinessProbe"]["httpGet"]["path"] == "/readyz", deployment["metadata"]["name"]
        assert main["livenessProbe"]["httpGet"]["path"] == "/healthz", deployment["metadata"]["name"]


def test_every_deployment_waits_for_its_schema(objects: list[dict]) -> None:
    for deployment in of_kind(objects, "Deployment"):
        names = [c["name"] for c in pod_spec(deployment)["initContainers"]]
        assert "wait-for-schema" in names, deployment["metadata"]["name"]
    (job,) = of_kind(objects, "Job")
    # Named after the release, so a new image makes a new Job instead of a refused change to the old one.
    tag = job["spec"]["template"]["spec"]["containers"][0]["image"].rsplit(":", 1)[1]
    assert job["metadata"]["name"] == f"migrate-{tag}"


def test_every_pod_is_under_a_default_deny_policy(objects: list[dict]) -> None:
    policies = of_kind(objects, "NetworkPolicy")
    deny_all = [p for p in policies if p["spec"]["podSelector"] == {}
                and set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
                and not p["spec"].get("ingress") and not p["spec"].get("egress")]
    assert deny_all, "no default-deny NetworkPolicy"
    namespaces = {p["metadata"]["namespace"] for p in deny_all}
    for obj in of_kind(objects, *POD_KINDS):
        assert obj["metadata"]["namespace"] in namespaces, obj["metadata"]["name"]


def test_no_egress_reaches_the_cloud_metadata_address(objects: list[dict]) -> None:
    for policy in of_kind(objects, "NetworkPolicy"):
        for rule in policy["spec"].get("egress", []):
            peers = rule.get("to")
            assert peers, f"{policy['metadata']['name']}: an egress rule to anywhere"
            for peer in peers:
                block = peer.get("ipBlock")
                if block is None:
                    continue  # pods picked by label: the metadata address is no pod
                cidr = ipaddress.ip_network(block["cidr"])
                excepted = [ipaddress.ip_network(e) for e in block.get("except", [])]
                for address in METADATA:
                    if address.version == cidr.version and address.subnet_of(cidr):
                        assert any(address.version == e.version and address.subnet_of(e) for e in excepted), (
                            f"{policy['metadata']['name']} lets pods reach {address}")


def test_no_container_runs_as_root(objects: list[dict]) -> None:
    for obj in of_kind(objects, *POD_KINDS):
        pod = pod_spec(obj)["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0, obj["metadata"]["name"]
        for container in containers(obj):
            context = container.get("securityContext", {})
            assert context.get("runAsUser", pod["runAsUser"]) != 0
            assert context["allowPrivilegeEscalation"] is False, container["name"]
            assert context["capabilities"]["drop"] == ["ALL"], container["name"]


def test_images_are_pinned_and_resources_set(objects: list[dict]) -> None:
    for obj in of_kind(objects, *POD_KINDS):
        for container in containers(obj):
            image = container["image"]
            assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), image
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), container["name"]
            assert "memory" in resources["limits"], container["name"]


def test_services_get_their_own_nats_user(objects: list[dict]) -> None:
    for deployment in of_kind(objects, "Deployment"):
        name = deployment["metadata"]["name"]
        env = {e["name"]: e for e in pod_spec(deployment)["containers"][0]["env"]}
        assert env["VIDJOBS_NATS_URL"]["value"] == f"nats://{name}:$(NATS_PASSWORD)@nats:4222"
        assert env["NATS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "vidjobs-nats", "key": name}


def test_in_prod_each_service_reaches_the_database_on_its_own_login() -> None:
    """Least privilege by default: each Deployment's containers take VIDJOBS_DATABASE_URL last from the
    service's own Secret (a login in its role, libs/common/grants.py); only the migrations Job uses the
    schema owner's."""
    objects = render("prod")
    secrets = {s["metadata"]["name"]: s for s in of_kind(objects, "Secret")}
    for deployment in of_kind(objects, "Deployment"):
        name = deployment["metadata"]["name"]
        for container in (c for c in containers(deployment) if c.get("envFrom")):
            refs = [e["secretRef"]["name"] for e in container["envFrom"] if "secretRef" in e]
            assert refs[-1] == f"vidjobs-db-{name}", (name, container["name"], refs)
        url = secrets[f"vidjobs-db-{name}"]["stringData"]["VIDJOBS_DATABASE_URL"]
        assert url.startswith(f"postgresql://vidjobs_{name}_login:"), url
    for job in of_kind(objects, "Job"):
        refs = {e["secretRef"]["name"] for c in containers(job) for e in c.get("envFrom", []) if "secretRef" in e}
        assert not {r for r in refs if r.startswith("vidjobs-db-")}, refs


async def test_a_service_user_can_do_its_work_in_nats_and_nothing_else(tmp_path: Path) -> None:
    """The NATS users and permissions of the manifests, on a real nats-server: a service creates the
    streams, publishes work, pulls and acks it; a publish outside the vidjobs subjects is refused, and so
    is a wrong password."""
    import nats

    from vidjobs.cli.embedded import free_port, nats_binary
    from vidjobs.common import bus

    (config,) = [o for o in render("prod") if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "nats-config"]
    (tmp_path / "auth.conf").write_text(config["data"]["auth.conf"])
    port = free_port()
    (tmp_path / "local.conf").write_text(
        f'listen: "127.0.0.1:{port}"\njetstream {{ store_dir: "{tmp_path / "js"}" }}\ninclude "auth.conf"\n')
    passwords = {f"{s.upper()}_PASSWORD": f"pw-{s}" for s in ("gateway", "submitter", "poller", "media", "reaper")}
    log = tmp_path / "nats.log"
    server = await asyncio.create_subprocess_exec(nats_binary(), "-c", str(tmp_path / "local.conf"), "-l", str(log),
                                                  env={**os.environ, **passwords})
    try:
        for _ in range(200):
            if log.exists() and "Server is ready" in log.read_text():
                break
            await asyncio.sleep(0.05)
        nc, js = await bus.connect(f"nats://submitter:pw-submitter@127.0.0.1:{port}", name="test")
        try:
            await bus.ensure_streams(js)
            await js.publish("vidjobs.work.submit", b"{}")
            psub = await js.pull_subscribe("vidjobs.work.submit", durable="submitter", stream=bus.WORK_STREAM)
            (msg,) = await psub.fetch(1, timeout=5)
            await msg.ack()

            refused: list[Exception] = []
            nc._error_cb = lambda exc: refused.append(exc)  # permission violations arrive asynchronously
            await nc.publish("elsewhere.subject", b"x")
            await nc.flush()
            await asyncio.sleep(0.2)
            assert any("permissions violation" in str(e).lower() for e in refused), refused
        finally:
            await nc.close()
        with pytest.raises(Exception):  # noqa: B017 - nats-py raises its own error or a timeout
            await nats.connect(f"nats://submitter:wrong@127.0.0.1:{port}", max_reconnect_attempts=0,
                               allow_reconnect=False, connect_timeout=2)
    finally:
        server.terminate()
        await asyncio.wait_for(server.wait(), 10)
