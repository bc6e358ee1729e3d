"""Every recorded provider payload says where its shape comes from, the SDK it names is the one pinned for the
tests and installed, and each payload an SDK model is named for parses with that model."""

from __future__ import annotations

import importlib.metadata
import json
import tomllib
from pathlib import Path

import pytest

from tests.conformance.provenance import PAYLOADS, model_of, payload_files, provenance, providers, validate

ROOT = Path(__file__).resolve().parents[2]


def test_every_provider_has_its_provenance():
    assert set(providers()) == {"fal", "luma", "replicate", "runway", "veo"}
    for provider in providers():
        assert (PAYLOADS / provider / "PROVENANCE.toml").is_file(), provider


@pytest.mark.parametrize("provider", providers())
def test_every_payload_names_its_source(provider: str):
    table = provenance(provider)

    assert set(table.payloads) == payload_files(provider)
    for name, source in table.payloads.items():
        assert source.model or source.docs, f"{provider}/{name} names neither an SDK model nor a docs page"
        assert not source.docs or source.docs.startswith("https://"), source.docs


@pytest.mark.parametrize("provider", providers())
def test_the_named_sdk_is_the_pinned_and_installed_one(provider: str):
    sdk = provenance(provider).sdk
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]["test"]

    assert f"{sdk.package}=={sdk.version}" in pins
    assert importlib.metadata.version(sdk.package) == sdk.version


@pytest.mark.parametrize(("provider", "name"), [(p, n) for p in providers()
                                                for n, s in provenance(p).payloads.items() if s.model])
def test_each_payload_parses_with_its_sdk_model(provider: str, name: str):
    model = model_of(provenance(provider).payloads[name].model)
    data = json.loads((PAYLOADS / provider / name).read_bytes())

    validate(model, data)
