"""deploy/compose.yaml, read as Docker Compose reads it (YAML merge keys included), against the code: every
vidjobs container's environment loads into Settings, each service runs its own module from its own image on its
own database user, and everything waits for the migration."""

from __future__ import annotations

import tomllib
from urllib.parse import urlsplit

import pytest
import yaml

from tests.sqlscan import ROOT
from tests.workspace import member
from vidjobs.common.grants import SERVICES, role
from vidjobs.common.settings import load
from vidjobs.common.signatures import decode_secret
from vidjobs.gateway.sealing import Keyring

COMPOSE = yaml.safe_load((ROOT / "deploy/compose.yaml").read_text())["services"]
VIDJOBS = {name: spec for name, spec in COMPOSE.items() if spec.get("image", "").startswith("vidjobs-")}


def image_of(distribution: str) -> str:
    """The image deploy/Dockerfile builds for a workspace member, tagged with the member's version."""
    project = tomllib.loads((ROOT / member(distribution).folder / "pyproject.toml").read_text())["project"]
    return f"{distribution}:{project['version']}"


def built_as(spec: dict) -> str:
    """The distribution a container's image installs: deploy/Dockerfile's SERVICE, which names the member."""
    assert spec["build"]["context"] == ".." and spec["build"]["dockerfile"] == "deploy/Dockerfile"
    return f"vidjobs-{spec['build']['args']['SERVICE']}"


@pytest.mark.parametrize("name", sorted(VIDJOBS))
def test_every_vidjobs_container_has_settings_the_code_accepts(name):
    environment = VIDJOBS[name]["environment"]

    settings = load(environment)  # an unknown or malformed VIDJOBS_* name raises here

    assert settings.nats_url == "nats://nats:4222" and settings.storage_url.startswith("s3://")
    assert environment["AWS_ENDPOINT_URL"] == "http://minio:9000"
    assert decode_secret(settings.fake_webhook_secret)


@pytest.mark.parametrize("name", sorted(VIDJOBS))
def test_only_the_gateway_holds_the_key_to_the_stored_webhook_secrets(name):
    settings = load(VIDJOBS[name]["environment"])

    if name == "gateway":
        assert Keyring.from_setting(settings.secrets_key).primary_id
    else:
        assert settings.secrets_key == ""


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_runs_its_module_as_its_own_user_after_the_migration(service):
    spec = COMPOSE[service]
    user = urlsplit(load(spec["environment"]).database_url).username

    assert spec["command"] == ["python", "-m", f"vidjobs.{service}"]
    assert built_as(spec) == f"vidjobs-{service}" and spec["image"] == image_of(f"vidjobs-{service}")
    assert user == f"{service}_login"
    assert spec["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
    assert spec["depends_on"]["logins"] == {"condition": "service_completed_successfully"}
    # The logins step makes every service's user a member of the role migrate granted.
    script = COMPOSE["logins"]["command"][0]
    assert f"ARRAY[{', '.join(repr(s) for s in SERVICES)}]" in script
    assert "'CREATE ROLE %I LOGIN PASSWORD %L IN ROLE %I', s || '_login', s, 'vidjobs_' || s" in script
    assert role(service) == f"vidjobs_{service}"


def test_the_migration_runs_as_the_schema_owner_once_the_database_is_up():
    migrate = COMPOSE["migrate"]
    owner = urlsplit(load(migrate["environment"]).database_url).username

    # Not the `vidjobs` command, which no service's image holds: the same migration, from the gateway's image.
    assert migrate["command"] == ["python", "-m", "vidjobs.common.migrate"]
    assert built_as(migrate) == "vidjobs-gateway" and migrate["image"] == image_of("vidjobs-gateway")
    assert owner == COMPOSE["postgres"]["environment"]["POSTGRES_USER"]
    assert migrate["depends_on"]["postgres"] == {"condition": "service_healthy"}
    assert "restart" not in migrate  # a one-shot: restarting it would hold back service_completed_successfully


def test_the_fake_provider_and_the_cli_run_from_images_of_their_own_that_no_service_uses():
    """The development parts ride in no service's image: the fake provider and the `vidjobs` command (which
    holds every member) are built apart, and the command only on demand (`docker compose run --rm cli ...`)."""
    assert built_as(COMPOSE["fake-provider"]) == "vidjobs-fakeprovider"
    assert COMPOSE["fake-provider"]["command"] == ["python", "-m", "vidjobs.fakeprovider"]
    assert built_as(COMPOSE["cli"]) == "vidjobs-cli" and COMPOSE["cli"]["profiles"] == ["tools"]
    production = {name: spec for name, spec in VIDJOBS.items() if name not in ("fake-provider", "cli")}
    assert set(production) == {*SERVICES, "migrate"}
    for name, spec in production.items():
        assert built_as(spec) in ("vidjobs-gateway", f"vidjobs-{name}"), name
        assert spec["image"].split(":")[0] == built_as(spec), name
