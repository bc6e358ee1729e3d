"""The text log format cannot be made to write a line of someone else's: whatever a client or a provider put
in a value (a request path, a header, a body field) is written with its line breaks and other control and
direction characters escaped, so one record is one line, as in the JSON format."""

from __future__ import annotations

import asyncio
import contextvars
import io
import logging
import os
import re
import sys

import aiohttp
import pytest

from tests.gateway_harness import gateway_settings
from tests.support import wait_process_ready
from vidjobs.common import logs, requestids, settings
from vidjobs.common.errors import ConfigError

# What a forger would write to start a line of their own, or to make a line read other than it is.
FORGING = {
    "line feed": "\n", "carriage return": "\r", "vertical tab": "\v", "form feed": "\f", "escape": "\x1b",
    "nul": "\x00", "record separator": "\x1e", "next line (C1)": "\x85", "C1 CSI": "\x9b",
    "line separator": "\u2028", "paragraph separator": "\u2029", "right-to-left override": "\u202e",
    "right-to-left isolate": "\u2067", "zero width space": "\u200b", "byte order mark": "\ufeff",
    "a byte that was no UTF-8": "\udcff",
}
FORGED = "gateway   info    FORGED admin=yes"


def _percent(text: str) -> str:
    return "".join(f"%{b:02X}" for b in text.encode("utf-8", "surrogateescape"))


async def test_a_request_path_cannot_forge_a_gateway_log_line(tmp_path, database_url, nats_url):
    settings = gateway_settings(tmp_path, database_url, nats_url, log_format="text")
    err = tmp_path / "gateway.err"
    with err.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "vidjobs.gateway", env={**os.environ, **settings.to_env()}, stderr=out)
    try:
        async with aiohttp.ClientSession() as session:
            await wait_process_ready(settings.gateway_url, proc)
            for name, char in FORGING.items():
                path = f"/v1/x{_percent(char)}{_percent(FORGED)}-{name.replace(' ', '-')}"
                async with session.get(settings.gateway_url + path, headers={"X-Request-Id": "forger"}) as resp:
                    assert resp.status == 401, name  # an unknown path needs a key: the access line names it
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 20)

    lines = err.read_text(encoding="utf-8", errors="backslashreplace").splitlines()
    for name in FORGING:
        mine = [line for line in lines if f"FORGED admin=yes-{name.replace(' ', '-')}" in line]
        assert len(mine) == 1, (name, mine)
        assert mine[0].startswith("gateway   info    request ") and "request_id=forger" in mine[0], (name, mine)
    assert not [line for line in lines if line.startswith("gateway   info    FORGED")]


# --- every field of the text format, through the formatter the services install -----------------------------


def _write(*, exc: BaseException | None = None, **fields: str) -> str:
    """What one record comes out as, with the job, account and request id set as a service sets them (in a
    context of its own, so nothing leaks into other tests)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.TextFormatter("worker"))
    logger = logging.getLogger(f"vidjobs.test.logs.{id(stream)}")
    logger.handlers[:], logger.propagate = [handler], False

    def emit() -> None:
        if "request_id" in fields:
            requestids.use(fields.pop("request_id"))
        if "job_id" in fields:
            logs.about_job(fields.pop("job_id"), fields.pop("account_id"))
        message = fields.pop("message")
        if exc is None:
            logger.warning("callback %s refused", message, extra=fields)
        else:
            logger.error("handling %s failed", message, exc_info=exc, extra=fields)

    contextvars.copy_context().run(emit)
    return stream.getvalue()


@pytest.mark.parametrize("char", FORGING.values(), ids=FORGING.keys())
def test_every_field_of_a_text_line_is_escaped(char):
    forged = f"x{char}{FORGED}"

    written = _write(message=forged, why=forged, request_id=forged, job_id=forged, account_id=forged,
                     **{forged: "a value under a name no code would use"})

    line = written.removesuffix("\n")  # the handler's own line end
    assert len(written.splitlines()) == 1 and char not in line, written
    words, pairs = _pairs(line)  # and every field reads back as it was given
    assert words == ["worker", "warning", f"callback {forged} refused"]
    assert {k: v for k, v in pairs.items() if v == forged}.keys() == {"why", "request_id", "job_id", "account_id"}
    assert list(pairs.values()).count("a value under a name no code would use") == 1


def test_a_traceback_keeps_its_lines_but_cannot_start_one_of_its_own():
    try:
        raise ValueError(f"bad input\n{FORGED}\u2028{FORGED}\x1b[2K")
    except ValueError as caught:
        written = _write(message="x", exc=caught)

    head, *rest = written.splitlines()
    assert head == "worker    error   handling x failed"
    assert rest and all(line.startswith("  | ") for line in rest), rest
    assert any("Traceback" in line for line in rest) and any(FORGED in line for line in rest)
    assert "\u2028" not in written and "\x1b" not in written


def test_printable_text_is_written_as_it_is():
    written = _write(message="https://cdn.example/ä b/ç.mp4", note="日本語", path=r"C:\dir")
    assert written == "worker    warning callback https://cdn.example/ä b/ç.mp4 refused note=日本語 path=C:\\dir\n"


SNEAKY = 'ok admin=yes job_id="job_other" x\\'  # spaces, pairs of its own, quotes and a backslash


_QUOTED = r'"(?:[^"\\]|\\.)*"'
_TOKEN = re.compile(rf'[^\s="]+=(?:{_QUOTED}|\S*)|{_QUOTED}|\S+')


def _unquote(text: str) -> str:
    if not text.startswith('"'):
        return text
    # The escapes of a quoted value are Python's (`\\n`, `\\x1b`, `\\u2028`, `\\\\`, `\\"`) on text that may hold
    # any character: the characters beyond Latin-1 go through as escapes of their own.
    return text[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")


def _pairs(line: str) -> tuple[list[str], dict[str, str]]:
    """A text line read as a logfmt reader reads it: words (the message in double quotes where it holds `=` or
    `"`), then `name=value` pairs, a value in double quotes (`\\"` and `\\\\` inside) where it has a space, `=`
    or `"`, or is empty."""
    words: list[str] = []
    pairs: dict[str, str] = {}
    for token in _TOKEN.findall(line):
        if not token.startswith('"') and "=" in token:
            name, _, value = token.partition("=")
            pairs[name] = _unquote(value)
        else:
            assert not pairs, f"a word after the pairs: {token!r}"
            words.append(_unquote(token))
    return words, pairs


def test_a_value_cannot_pass_for_pairs_of_its_own():
    written = _write(message=f"as {SNEAKY}", note=SNEAKY, empty="", **{"odd name=x": SNEAKY})

    words, pairs = _pairs(written)
    assert words == ["worker", "warning", f"callback as {SNEAKY} refused"]  # one word: the quoted message
    assert pairs == {"note": SNEAKY, "empty": "", "odd\\x20name\\x3dx": SNEAKY}


def test_the_json_format_already_escapes_them():
    formatter = logs.JsonFormatter("worker")
    for char in FORGING.values():
        record = logging.LogRecord("vidjobs.test", logging.INFO, __file__, 1, "%s", (f"x{char}{FORGED}",), None)
        line = formatter.format(record)
        assert len(line.splitlines()) == 1 and char not in line


def test_an_unknown_log_format_is_refused_not_taken_for_text():
    with pytest.raises(ConfigError, match="VIDJOBS_LOG_FORMAT"):
        settings.load({"VIDJOBS_LOG_FORMAT": "txt"})
