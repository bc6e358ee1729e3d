"""Where the API is and which key to use, for the commands that talk to it: flags first, then
`VIDJOBS_URL` / `VIDJOBS_API_KEY`, then the file `vidjobs login` writes (`VIDJOBS_CONFIG`, else
`$XDG_CONFIG_HOME/vidjobs/config.json`, else `~/.config/vidjobs/config.json`). The file holds a secret, so it
is written readable by its owner only."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from vidjobs.common.errors import ConfigError

DEFAULT_URL = "http://127.0.0.1:8080"


class Profile(msgspec.Struct, forbid_unknown_fields=True):
    url: str = DEFAULT_URL
    api_key: str | None = None


def config_path() -> Path:
    if named := os.environ.get("VIDJOBS_CONFIG"):
        return Path(named)
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "vidjobs" / "config.json"


def saved() -> Profile:
    path = config_path()
    try:
        return msgspec.json.decode(path.read_bytes(), type=Profile)
    except FileNotFoundError:
        return Profile()
    except (OSError, msgspec.DecodeError) as exc:
        raise ConfigError(f"cannot read {path} ({exc}); fix it, or run `vidjobs login` to write it again") from exc


def resolve_url() -> str:
    return os.environ.get("VIDJOBS_URL") or saved().url


def resolve(url: str | None, api_key: str | None) -> Profile:
    stored = saved()
    profile = Profile(url=url or os.environ.get("VIDJOBS_URL") or stored.url,
                      api_key=api_key or os.environ.get("VIDJOBS_API_KEY") or stored.api_key)
    if not profile.api_key:
        raise ConfigError("no API key: run `vidjobs login`, set VIDJOBS_API_KEY, or pass --api-key "
                          "(`vidjobs up` prints one; `vidjobs accounts create NAME` makes another)")
    return profile


def save(profile: Profile) -> Path:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(msgspec.json.format(msgspec.json.encode(profile)) + b"\n")
    partial.replace(path)
    return path


def forget() -> Path | None:
    path = config_path()
    if not path.exists():
        return None
    path.unlink()
    return path
