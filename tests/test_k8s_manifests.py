"""The Kubernetes manifests, as `kubectl kustomize` renders each overlay: every object valid against the
Kubernetes schemas (strictly: an unknown field is an error), and the properties a safe deployment rests on."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests import workspace
from tests.workspace import member
from vidjobs.common.settings import PREFIX, Settings

K8S = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
OVERLAYS = ["dev", "prod", "prod+cloudnative-pg"]
# The oldest Kubernetes the README supports whose schemas the validator ships.
KUBERNETES_VERSION = "1.29"
# Custom resources: their schemas come with their operators, not with Kubernetes. Checked below by hand,
# for the fields these manifests rely on.
CUSTOM_KINDS = {"ScaledObject", "PodMonitor", "PrometheusRule", "Certificate", "Issuer", "Cluster"}
METADATA = [ipaddress.ip_network("169.254.169.254/32"), ipaddress.ip_network("fd00:ec2::254/128")]
# Addresses that are not the internet: private networks (where the cluster's pods, services and nodes live),
# carrier-grade NAT, link-local (the metadata service), and their IPv6 counterparts. Egress to the internet
# excludes them all; a pod reaches such an address only through a rule that names it and its ports.
PRIVATE = [ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
                                             "169.254.0.0/16", "fc00::/7", "fe80::/10")]
POD_KINDS = {"Deployment", "StatefulSet", "Job"}


def render(overlay: str) -> list[dict]:
    """An overlay as `kubectl kustomize` renders it; `overlay+component` adds an optional component (the way
    an overlay opts in), from a kustomization made for the purpose."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        if os.environ.get("CI"):
            pytest.fail("kubectl is needed to render the manifests (kubectl kustomize) and is not installed")
        pytest.skip("kubectl is not installed: the manifests cannot be rendered here")
    base, *extra = overlay.split("+")
    with tempfile.TemporaryDirectory() as scratch:
        target = K8S / "overlays" / base
        if extra:
            target = Path(scratch)
            (target / "kustomization.yaml").write_text(yaml.safe_dump({
                "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                "resources": [os.path.relpath(K8S / "overlays" / base, target)],  # kustomize takes no absolute
                "components": [os.path.relpath(K8S / "components" / name, target) for name in extra]}))
        out = subprocess.run([kubectl, "kustomize", str(target)], check=True, capture_output=True, text=True,
                             timeout=60).stdout
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


def test_the_in_cluster_database_replicates_synchronously() -> None:
    # An asynchronous failover loses jobs the API acknowledged (docs/RELIABILITY.md "PostgreSQL failover").
    [cluster] = of_kind(render("prod+cloudnative-pg"), "Cluster")
    assert cluster["apiVersion"] == "postgresql.cnpg.io/v1"
    assert cluster["spec"]["instances"] >= 3  # a commit still has a replica to confirm it while one is down
    assert cluster["spec"]["postgresql"]["synchronous"] == {"method": "any", "number": 1,
                                                           "dataDurability": "required"}


# The work consumers a ScaledObject scales at one replica per this many of their messages, and the setting of how
# many one replica handles at once.
PER_REPLICA = {"submitter": "VIDJOBS_SUBMIT_CONCURRENCY", "poller-inbox": "VIDJOBS_INBOX_CONCURRENCY",
               "poller-poll": "VIDJOBS_POLL_CONCURRENCY", "media-download": "VIDJOBS_DOWNLOAD_CONCURRENCY"}


def test_a_scaler_s_threshold_is_what_one_replica_of_its_consumer_is_set_to_handle() -> None:
    config = yaml.safe_load((K8S / "base" / "configmap.yaml").read_text())["data"]
    thresholds = {}
    for scaled in yaml.safe_load_all((K8S / "components" / "autoscaling" / "scalers.yaml").read_text()):
        for trigger in scaled["spec"].get("triggers", []):
            consumer = re.search(r'vidjobs_messages_in_handling\{[^}]*consumer="([^"]+)"', trigger["metadata"]["query"])
            if consumer is not None and consumer.group(1) in PER_REPLICA:
                thresholds[consumer.group(1)] = trigger["metadata"]["threshold"]
    assert thresholds == {consumer: config[setting] for consumer, setting in PER_REPLICA.items()}


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


# The image each workload runs (deploy/Dockerfile, one per service): the migrations Job needs only common, and
# runs from the gateway's image, which every release ships anyway.
IMAGES = {"gateway": "vidjobs-gateway", "submitter": "vidjobs-submitter", "poller": "vidjobs-poller",
          "media": "vidjobs-media", "reaper": "vidjobs-reaper", "migrate": "vidjobs-gateway"}


def test_every_workload_runs_its_own_service_image_and_none_the_fake_provider(objects: list[dict]) -> None:
    tags = set()
    for obj in of_kind(objects, "Deployment", "Job"):
        for container in containers(obj):
            repository, tag = container["image"].rsplit(":", 1)
            assert repository.rsplit("/", 1)[-1] == IMAGES[workload(obj)], (workload(obj), container["name"])
            tags.add(tag)
    assert len(tags) == 1, tags  # one release: every image of one tag, the one the migrations Job is named after
    for distribution in set(IMAGES.values()):
        assert not workspace.closure(distribution) & {"vidjobs-fakeprovider", "vidjobs-cli"}, distribution


def test_every_module_a_container_runs_is_in_its_image(objects: list[dict]) -> None:
    """What each command imports (`python -m vidjobs.x`, `from vidjobs.x.y import ...` in check-settings) is a
    module of a member the workload's image installs, so no pod fails on an import the image lacks; the schema
    steps run common's migrate, never the `vidjobs` command, which no service's image holds."""
    for obj in of_kind(objects, "Deployment", "Job"):
        held = workspace.closure(IMAGES[workload(obj)])
        for container in containers(obj):
            command = " ".join(container.get("command", []))
            assert not re.search(r"(^|\s)vidjobs\s|vidjobs\.cli", command), (workload(obj), container["name"])
            for module in re.findall(r"\b(vidjobs\.[a-z_]+)", command):
                assert member(module).distribution in held, (workload(obj), container["name"], module)
    (job,) = of_kind(objects, "Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == ["python", "-m", "vidjobs.common.migrate"]
    for deployment in of_kind(objects, "Deployment"):
        (wait,) = [c for c in pod_spec(deployment)["initContainers"] if c["name"] == "wait-for-schema"]
        assert "python -m vidjobs.common.migrate --check" in wait["command"][-1], deployment["metadata"]["name"]


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
        # Every node of the cluster, each with the service's own user: a frozen node is left for another.
        nodes = [f"nats://{name}:$(NATS_PASSWORD)@nats-{i}.nats-headless:4222" for i in range(3)]
        assert env["VIDJOBS_NATS_URL"]["value"].split(",") == nodes
        assert env["NATS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "vidjobs-nats", "key": name}


def database_url_source(container: dict) -> str | None:
    """The Secret a container's VIDJOBS_DATABASE_URL comes from (no database Secret is read whole)."""
    assert not any(e.get("secretRef") for e in container.get("envFrom", [])), container["name"]
    refs = [e["valueFrom"]["secretKeyRef"]["name"] for e in container.get("env", [])
            if e["name"] == "VIDJOBS_DATABASE_URL"]
    return refs[0] if refs else None


def test_in_prod_each_service_reaches_the_database_on_its_own_login() -> None:
    """Least privilege by default: each Deployment's containers take VIDJOBS_DATABASE_URL from the service's
    own Secret (a login in its role, vidjobs.common.grants); only the migrations Job uses the schema owner's."""
    objects = render("prod")
    secrets = {s["metadata"]["name"]: s for s in of_kind(objects, "Secret")}
    for deployment in of_kind(objects, "Deployment"):
        name = deployment["metadata"]["name"]
        for container in containers(deployment):
            if container["name"] != "trust-nats-ca":  # copies a CA file, and reads no setting
                assert database_url_source(container) == f"vidjobs-db-{name}", (name, container["name"])
        url = secrets[f"vidjobs-db-{name}"]["stringData"]["VIDJOBS_DATABASE_URL"]
        assert url.startswith(f"postgresql://vidjobs_{name}_login:"), url
    for job in of_kind(objects, "Job"):
        assert [database_url_source(c) for c in containers(job)] == ["vidjobs-secrets"]


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


# --- which secrets each workload can read ------------------------------------------------------------------

DB = "VIDJOBS_DATABASE_URL"
S3 = {("vidjobs-secrets", "AWS_ACCESS_KEY_ID"), ("vidjobs-secrets", "AWS_SECRET_ACCESS_KEY")}
API_KEYS = {("vidjobs-provider-secrets", f"VIDJOBS_{name}") for name in (
    "REPLICATE_API_TOKEN", "FAL_API_KEY", "RUNWAY_API_KEY", "LUMA_API_KEY", "VEO_API_KEY")}
REPLICATE_WEBHOOK = ("vidjobs-provider-secrets", "VIDJOBS_REPLICATE_WEBHOOK_SECRET")
# What each workload's code reads, besides the database URL (the migrator's in dev, the service's own login in
# prod) and, for a service, its own NATS password:
NEEDS: dict[str, set[tuple[str, str]]] = {
    # S3 for outputs' signed URLs and uploads; Replicate's webhook secret to verify its callbacks; the key
    # that encrypts app webhook secrets at rest. No provider API key: it never calls a provider
    # (VIDJOBS_PROVIDERS builds the adapters it validates and verifies with).
    "gateway": S3 | {REPLICATE_WEBHOOK, ("vidjobs-gateway-secrets", "VIDJOBS_SECRETS_KEY")},
    # Every provider's API key to submit; S3 to sign input images' URLs for the provider; Replicate's webhook
    # secret only to know whether to ask Replicate for callbacks (ReplicateAdapter.supports_callbacks).
    "submitter": S3 | API_KEYS | {REPLICATE_WEBHOOK},
    # Every provider's API key to poll and cancel; no storage.
    "poller": API_KEYS,
    # S3 to store renders; Veo's key because Veo's render URLs on the Gemini API are keyed downloads (KEYED_DOWNLOADS).
    "media": S3 | {("vidjobs-provider-secrets", "VIDJOBS_VEO_API_KEY")},
    # The database and NATS only.
    "reaper": set(),
    # The schema owner's URL, and nothing else.
    "migrate": set(),
}
# Secret keys that are not secret: the NATS CA certificate the nats-tls component mounts for the services.
PUBLIC_KEYS = {("nats-server-tls", "ca.crt")}
ENTRY_MODULES = {"gateway": "vidjobs.gateway.__main__", "submitter": "vidjobs.submitter.__main__",
                 "poller": "vidjobs.poller.__main__", "media": "vidjobs.media.__main__",
                 "reaper": "vidjobs.reaper.__main__", "migrate": "vidjobs.common.migrate"}


def workload(obj: dict) -> str:
    return obj["metadata"]["labels"]["app.kubernetes.io/component"]


def secret_keys(objects: list[dict]) -> dict[str, set[str]]:
    return {s["metadata"]["name"]: set(s.get("stringData", {})) | set(s.get("data", {}))
            for s in of_kind(objects, "Secret")}


def visible_secrets(obj: dict, rendered: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(Secret, key) of every secret value a pod of `obj` can read: all keys of a Secret in envFrom (`*` when
    the Secret is made elsewhere), the one key of each secretKeyRef, and the files of a Secret volume."""
    seen: set[tuple[str, str]] = set()
    for container in containers(obj):
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                name = source["secretRef"]["name"]
                seen |= {(name, key) for key in rendered.get(name, {"*"})}
        for var in container.get("env", []):
            if ref := var.get("valueFrom", {}).get("secretKeyRef"):
                seen.add((ref["name"], ref["key"]))
    for volume in pod_spec(obj).get("volumes", []):
        if secret := volume.get("secret"):
            name = secret["secretName"]
            items = [item["key"] for item in secret.get("items", [])]
            seen |= {(name, key) for key in items or rendered.get(name, {"*"})}
    return seen


def expected_secrets(obj: dict, rendered: dict[str, set[str]]) -> set[tuple[str, str]]:
    name = workload(obj)
    own_login = f"vidjobs-db-{name}"
    database = {(own_login if own_login in rendered else "vidjobs-secrets", DB)}
    nats = {("vidjobs-nats", name)} if obj["kind"] == "Deployment" else set()
    return NEEDS[name] | database | nats


def test_each_workload_can_read_exactly_the_secrets_its_code_uses(objects: list[dict]) -> None:
    rendered = secret_keys(objects)
    workloads = of_kind(objects, "Deployment", "Job")
    assert {workload(o) for o in workloads} == set(NEEDS)
    for obj in workloads:
        seen = visible_secrets(obj, rendered) - PUBLIC_KEYS
        expected = expected_secrets(obj, rendered)
        assert seen == expected, (workload(obj), "extra:", sorted(seen - expected), "missing:",
                                  sorted(expected - seen))


def test_a_secret_fills_the_variable_of_its_own_name(objects: list[dict]) -> None:
    """Provider, S3, database and gateway keys are named as the variables they fill, so a reference cannot
    hand one service's setting another's value unnoticed; every VIDJOBS_* one is a setting the loader knows."""
    fields = {PREFIX + f.upper() for f in Settings.__struct_fields__}
    for obj in of_kind(objects, "Deployment", "Job"):
        for container in containers(obj):
            for var in container.get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref is None or ref["name"] == "vidjobs-nats":
                    continue
                assert var["name"] == ref["key"], (workload(obj), container["name"], var["name"], ref)
                assert var["name"] in fields or not var["name"].startswith(PREFIX), var["name"]


@pytest.fixture(scope="module")
def code_reads() -> dict[str, set[str]]:
    """Per workload, the secret variables its code could read at all: every secret setting whose name appears
    in a module the workload's entry point loads (but settings.py, which declares them all), and the AWS_*
    keys where the storage factory is loaded (it loads the S3 backend, whose botocore reads them). An upper
    bound, found by reading the code rather than by trusting the table above."""
    secret_names = {key for keys in NEEDS.values() for _, key in keys} | {DB}
    reads: dict[str, set[str]] = {}
    for name, module in ENTRY_MODULES.items():
        script = (f"import sys, {module}\n"
                  "for m in sorted(sys.modules):\n"
                  "    f = getattr(sys.modules[m], '__file__', None)\n"
                  "    if m.startswith('vidjobs') and f: print(m, f)")
        out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True,
                             timeout=120).stdout
        loaded = dict(line.split(" ", 1) for line in out.splitlines())
        # settings.py declares every setting; the question is which are read
        source = "\n".join(Path(path).read_text() for m, path in loaded.items() if m != "vidjobs.common.settings")
        found = {key for key in secret_names
                 if key.startswith(PREFIX) and re.search(rf"\b{key[len(PREFIX):].lower()}\b", source)}
        if "vidjobs.storage.factory" in loaded:  # it loads the S3 backend when the storage URL is s3://
            found |= {key for key in secret_names if key.startswith("AWS_")}
        reads[name] = found
    return reads


def test_no_workload_is_given_a_secret_its_code_never_reads(code_reads: dict[str, set[str]]) -> None:
    for name, needs in NEEDS.items():
        given = {key for _, key in needs} | {DB}
        assert given <= code_reads[name], (name, sorted(given - code_reads[name]))
    assert not code_reads["reaper"] - {DB}, code_reads["reaper"]
    assert not code_reads["migrate"] - {DB}, code_reads["migrate"]


def test_no_egress_to_the_internet_reaches_a_private_address(objects: list[dict]) -> None:
    """An ipBlock that reaches the internet excepts every private range, so a URL that resolves inside the
    cluster (a provider's render URL, a client's webhook) is stopped here as well as by the services' own
    guard. Private addresses a pod does need are reached by rules that name them, on named ports."""
    for policy in of_kind(objects, "NetworkPolicy"):
        name = policy["metadata"]["name"]
        for rule in policy["spec"].get("egress", []):
            for peer in rule["to"]:
                block = peer.get("ipBlock")
                if block is None:
                    continue  # pods picked by label
                cidr = ipaddress.ip_network(block["cidr"])
                ranges = [r for r in PRIVATE if r.version == cidr.version]
                if any(cidr.subnet_of(r) for r in ranges):
                    assert rule.get("ports"), f"{name}: every port of {cidr}"
                    continue
                excepted = [ipaddress.ip_network(e) for e in block.get("except", [])]
                for private in ranges:
                    if private.overlaps(cidr):
                        assert any(private.subnet_of(e) for e in excepted), f"{name}: {cidr} reaches {private}"


@pytest.mark.parametrize(("answers", "status"), [([0], 0), ([11], 0), ([2], 2), ([10, 0], 0), ([9, 11], 0)])
def test_wait_for_schema_waits_while_behind_and_starts_beside_a_newer_schema(
        objects: list[dict], tmp_path, answers: list[int], status: int) -> None:
    """The init container's own script, run by sh with a `python` that answers `migrate --check` with the
    statuses given in turn (and `sleep` that returns at once): 11, a schema newer than the image (a rollback,
    an old pod restarting mid-rollout), lets the pod start; 2 stops the wait; anything else waits."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (tmp_path / "answers").write_text("\n".join(map(str, answers)) + "\n")
    # The last answer repeats: a wait that never ends shows as a timeout, not as a late success.
    (fake / "python").write_text(f"#!/bin/sh\nn=$(head -n1 {tmp_path}/answers)\n"
                                 f"[ $(wc -l < {tmp_path}/answers) -gt 1 ] && sed -i 1d {tmp_path}/answers\n"
                                 "exit $n\n")
    (fake / "sleep").write_text("#!/bin/sh\nexit 0\n")
    for tool in ("python", "sleep"):
        (fake / tool).chmod(0o755)
    for deployment in of_kind(objects, "Deployment"):
        (wait,) = [c for c in pod_spec(deployment)["initContainers"] if c["name"] == "wait-for-schema"]
        (tmp_path / "answers").write_text("\n".join(map(str, answers)) + "\n")
        ran = subprocess.run(wait["command"], env={"PATH": f"{fake}:/usr/bin:/bin"}, capture_output=True,
                             text=True, timeout=10)
        assert ran.returncode == status, (deployment["metadata"]["name"], ran.stderr)
