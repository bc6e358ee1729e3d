"""One version across the workspace, and a changelog the release tests can read (docs/RELEASES.md).

Every member, the workspace root, what `vidjobs --version` and the Python client report, and the images'
tags in compose and the Kubernetes overlays name the version under way; it is newer than every release
CHANGELOG.md records, each of which names a commit of this history."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import pytest

import vidjobs_client
from tests import releases, workspace
from vidjobs_client import connection

ROOT = workspace.ROOT
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE_FILES = ["deploy/compose.yaml", "deploy/k8s/overlays/dev/kustomization.yaml",
               "deploy/k8s/overlays/prod/kustomization.yaml"]


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def test_every_member_has_the_workspace_version():
    versions = {m.distribution: tomllib.loads((ROOT / m.folder / "pyproject.toml").read_text())["project"]["version"]
                for m in workspace.members()}
    assert set(versions.values()) == {VERSION}, versions


def test_what_reports_a_version_reports_this_one():
    out = subprocess.run([sys.executable, "-m", "vidjobs.cli", "--version"], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == f"vidjobs {VERSION}"
    assert vidjobs_client.__version__ == VERSION
    assert connection.USER_AGENT == f"vidjobs-client/{VERSION}"


@pytest.mark.parametrize("path", IMAGE_FILES)
def test_the_images_are_tagged_with_this_version(path: str):
    text = (ROOT / path).read_text()
    tags = re.findall(r"image: vidjobs-[\w-]+:(\S+)", text) + re.findall(r"newTag: (\S+)", text)
    assert tags and set(tags) == {VERSION}, tags


def test_the_changelog_reads_and_the_version_under_way_is_not_released():
    text = releases.CHANGELOG.read_text()
    released = releases.released(text)
    assert released, "CHANGELOG.md records no release"
    assert [r.version for r in released] == sorted((r.version for r in released), key=_key, reverse=True)
    assert all(_key(VERSION) > _key(r.version) for r in released), (VERSION, released)
    for release in released:
        full = releases.resolve(release.commit)
        assert full is not None, f"{release.version}'s commit {release.commit} is not in this history"
        releases.check_tag(release, full)
    unreleased = releases.unreleased_entries(text)
    assert {"### Added", "### Changed", "### Fixed"} <= set(unreleased)


def test_the_previous_release_is_the_newest_that_is_not_this_checkout():
    head = releases.resolve("HEAD")
    assert head is not None
    text = ("# Changelog\n\n## [Unreleased]\n\n"
            f"## [0.9.0] — 2027-01-02 — commit {head[:9]}\n\n## [0.1.0] — 2026-12-03 — commit 737820f\n")
    release, full = releases.previous_release(text)
    assert release.version == "0.1.0" and full.startswith("737820f")


def test_a_release_whose_commit_is_missing_is_an_error_not_a_skip():
    text = "## [Unreleased]\n\n## [0.1.1] — 2026-12-04 — commit 0123456789abcdef\n"
    with pytest.raises(releases.ReleaseNotFound, match="not in this clone"):
        releases.previous_release(text)


def test_a_malformed_version_heading_is_refused():
    with pytest.raises(ValueError, match="version heading"):
        releases.released("## [Unreleased]\n\n## [0.1.0] - 2026-12-03\n")


def test_a_tag_elsewhere_than_the_changelogs_commit_is_an_error():
    tagged = releases.resolve("refs/tags/v0.1.0")
    head = releases.resolve("HEAD")
    assert head is not None
    release = releases.Release("0.1.0", "2026-12-03", head[:9])
    if tagged is None:
        # A clone without the tags: the changelog alone is read, and nothing contradicts it.
        releases.check_tag(release, head)
        return
    with pytest.raises(releases.ReleaseNotFound, match="tag v0.1.0 is on"):
        releases.check_tag(release, head)
