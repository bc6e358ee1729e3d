"""`vidjobs render`, `vidjobs jobs ...`, `account`, `models`, `login` as a person and a script run them, against
the real stack: a render followed and saved with its checksum checked, the job commands, exit statuses that
tell a usage error from a refusal from a failed render, a 429 waited out, the key remembered by `login`, and
the live stage line on a terminal."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import imagefiles
from tests.stack import demo_key, running_stack, stack_settings
from vidjobs.cli.embedded import free_port
from vidjobs.cli.exitcodes import Exit


@pytest.fixture
def settings(tmp_path, database_url, nats_url):
    return stack_settings(tmp_path, database_url, nats_url)


def _env(tmp: Path, url: str | None, key: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIDJOBS_")}
    env["VIDJOBS_CONFIG"] = str(tmp / "config.json")
    if url:
        env["VIDJOBS_URL"] = url
    if key:
        env["VIDJOBS_API_KEY"] = key
    return env


async def vidjobs(env: dict[str, str], *args: str, stdin: str = "", cwd: Path | None = None,
                  ) -> subprocess.CompletedProcess[str]:
    """The command as a script runs it: stdout and stderr piped, not a terminal."""
    return await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "vidjobs.cli", *args], env=env, input=stdin,
                                   capture_output=True, text=True, timeout=120, cwd=cwd)


def _json(result: subprocess.CompletedProcess[str]) -> list[dict]:
    return [json.loads(line) for line in result.stdout.splitlines()]


async def test_render_wait_save_and_the_job_commands(settings, tmp_path):
    image = tmp_path / "frame.png"
    image.write_bytes(imagefiles.noise_png(64))
    async with running_stack(settings) as stack:
        env = _env(tmp_path, stack.url, stack.key)
        done = await vidjobs(env, "render", "a red fox in snow", "-m", "fake/default", "-d", "1", "--wait",
                             "-o", str(tmp_path / "fox.mp4"), "--json", "--meta", "shot=1")
        assert done.returncode == Exit.OK, done.stderr
        [job] = _json(done)
        assert job["status"] == "completed" and job["metadata"] == {"shot": "1"}
        video = (tmp_path / "fox.mp4").read_bytes()
        assert hashlib.sha256(video).hexdigest() == job["outputs"]["sha256"]

        # Piped and without --json, each command prints just what it exists to give.
        saved = await vidjobs(env, "jobs", "download", job["id"], "-o", str(tmp_path))
        assert saved.stdout.strip() == str(tmp_path / f"{job['id']}.mp4") and saved.returncode == Exit.OK
        thumb = await vidjobs(env, "jobs", "download", job["id"], "--part", "thumbnail", "-o", str(tmp_path))
        assert Path(thumb.stdout.strip()).read_bytes()[:2] == b"\xff\xd8"  # a JPEG
        shown = _json(await vidjobs(env, "jobs", "show", job["id"], "--json"))
        assert shown[0]["id"] == job["id"] and shown[0]["cost"]["actual_credits"] > 0

        from_image = await vidjobs(env, "render", "the frame moves", "--image", str(image), "--param",
                                   "scenario=hang", "--batch", "--json", "--fallback", "fake-poll/default",
                                   "--max-wait", "300")
        started = _json(from_image)[0]
        assert started["input_image"].startswith("upl_") and started["params"] == {"scenario": "hang"}
        assert (started["fallback_models"], started["max_wait_s"]) == (["fake-poll/default"], 300)
        assert started["priority"] == "batch" and job["priority"] == "interactive"
        # `jobs show` names the lane when it is not the default one.
        lanes = [(await vidjobs(env, "jobs", "show", j["id"])).stdout for j in (started, job)]
        assert re.search(r"priority\s+batch", lanes[0]) and "priority" not in lanes[1], lanes
        listed = (await vidjobs(env, "jobs", "list", "--status", "pending,submitted,processing")).stdout
        assert [line.split("\t")[0] for line in listed.splitlines()] == [started["id"]]
        canceled = await vidjobs(env, "jobs", "cancel", started["id"])
        assert canceled.stdout.strip() == f"{started['id']} canceled"
        watched = await vidjobs(env, "jobs", "watch", started["id"])
        assert watched.returncode == Exit.JOB_FAILED and "canceled" in watched.stderr

        removed = await vidjobs(env, "jobs", "rm", job["id"], started["id"])
        assert removed.returncode == Exit.OK and removed.stdout.count("deleted") == 2
        gone = await vidjobs(env, "jobs", "show", job["id"])
        assert gone.returncode == Exit.API_ERROR and "not_found" in gone.stderr and "request req_" in gone.stderr
        everything = _json(await vidjobs(env, "jobs", "list", "--json"))
        assert everything == []
        models = (await vidjobs(env, "models")).stdout
        assert "fake/default\t1-60 s" in models
        account = _json(await vidjobs(env, "account", "--json"))[0]
        assert account["credits"]["balance"] < 1_000_000  # the render was charged


async def test_exit_statuses_tell_what_went_wrong(settings, tmp_path):
    async with running_stack(settings) as stack:
        env = _env(tmp_path, stack.url, stack.key)
        failed = await vidjobs(env, "render", "a fox", "-m", "fake/default", "-d", "1", "--param",
                               "scenario=content_rejected", "--wait")
        assert failed.returncode == Exit.JOB_FAILED
        assert "content_rejected" in failed.stderr and "what to do: change the prompt" in failed.stderr
        refused = await vidjobs(env, "render", "a fox", "-m", "fake/default", "-d", "600")
        assert refused.returncode == Exit.API_ERROR and "duration_s" in refused.stderr
        assert "invalid_input" in refused.stderr
        bad_flag = await vidjobs(env, "render", "a fox", "-d", "five")
        assert bad_flag.returncode == Exit.USAGE and "invalid int value" in bad_flag.stderr
        no_key = await vidjobs(_env(tmp_path, stack.url, None), "jobs", "list")
        assert no_key.returncode == Exit.USAGE and "vidjobs login" in no_key.stderr
        no_file = await vidjobs(env, "render", "a fox", "--image", str(tmp_path / "missing.png"))
        assert no_file.returncode == Exit.USAGE and "no such file" in no_file.stderr
        wrong_key = await vidjobs(_env(tmp_path, stack.url, "vj_wrong"), "account")
        assert wrong_key.returncode == Exit.API_ERROR and "HTTP 401" in wrong_key.stderr
        timed = await vidjobs(env, "render", "slow", "-m", "fake/default", "-d", "1", "--param", "scenario=hang",
                              "--timeout", "1")
        assert timed.returncode == Exit.TIMED_OUT and "did not finish" in timed.stderr
    nowhere = await vidjobs(_env(tmp_path, f"http://127.0.0.1:{free_port()}", "vj_x"), "account")
    assert nowhere.returncode == Exit.UNREACHABLE and "cannot reach the API" in nowhere.stderr
    version = await vidjobs(_env(tmp_path, None, None), "--version")
    assert version.stdout.startswith("vidjobs ") and version.returncode == 0


async def test_login_a_429_waited_out_and_the_live_line_on_a_terminal(settings, tmp_path):
    # One request per 10 s: however slowly this machine starts each command, the next comes too soon.
    key = await demo_key(settings.database_url, requests_per_s=0.1, request_burst=1)
    async with running_stack(settings, key=key) as stack:
        env = _env(tmp_path, None, None)
        login = await vidjobs(env, "login", "--url", stack.url, "--with-token", stdin=key + "\n")
        assert login.returncode == Exit.OK and "logged in" in login.stderr, login.stderr
        config = tmp_path / "config.json"
        assert json.loads(config.read_text()) == {"url": stack.url, "api_key": key}
        assert config.stat().st_mode & 0o777 == 0o600
        # The key is remembered; a request within the account's rate is refused 429, waited out and retried.
        first, second = [await vidjobs(env, "account", "--json") for _ in range(2)]
        assert first.returncode == second.returncode == Exit.OK, second.stderr
        assert "rate_limited (HTTP 429); trying again in" in first.stderr + second.stderr

        # The live line, with a key of ordinary limits (the environment's key comes before the saved one).
        quick = {**env, "VIDJOBS_API_KEY": await demo_key(settings.database_url)}
        screen = await asyncio.to_thread(_on_a_terminal, quick, tmp_path, "render", "a fox", "-m", "fake/default",
                                         "-d", "1", "-o", str(tmp_path / "tty.mp4"))
        assert "queued › submitted › rendering" in screen and "ready" in screen, screen
        assert "downloading job_" in screen and "saved to" in screen
        assert (tmp_path / "tty.mp4").stat().st_size > 0
        assert (await vidjobs(env, "logout")).returncode == Exit.OK and not config.exists()


def _on_a_terminal(env: dict[str, str], cwd: Path, *args: str) -> str:
    """The command's output as a person at a terminal sees it (stdout and stderr on a pseudo-terminal)."""
    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "vidjobs.cli", *args], stdin=child, stdout=child, stderr=child,
                            env={**env, "TERM": "xterm-256color", "COLUMNS": "120"}, cwd=cwd)
    os.close(child)
    output = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the terminal closed with the command
            break
        if not chunk:
            break
        output += chunk
    os.close(main)
    assert proc.wait(timeout=120) == Exit.OK, output.decode(errors="replace")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output.decode(errors="replace"))  # colours and cursor moves
