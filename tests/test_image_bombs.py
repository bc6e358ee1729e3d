"""Hostile uploads against the real gateway process: decompression bombs, oversized and endless bodies, files
lying about their type, headers too short to read. Each is refused from its header alone with the right
status and code, nothing is stored, and the gateway's peak memory (VmHWM) barely moves although the bombs
declare tens of gigabytes of pixels. (What only decoding finds, the media worker rejects: test_uploads.)"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from tests import imagefiles
from tests.stack import Stack, running_stack, stack_settings
from vidjobs.cli.supervisor import SERVICES

MB = 1024 * 1024
# Far below what any bomb would need decoded (the smallest declares 3.6 GB), far above what reading a
# 10 MiB body and the ordinary churn of a Python process take.
MAX_GROWTH_MB = 64


@dataclass(frozen=True)
class Case:
    name: str
    body: Callable[[int], bytes]  # given upload_max_bytes
    content_type: str
    status: int
    code: str
    mentions: str  # a word the message must contain
    declared_decoded: int = 0  # bytes the image would take decoded, as its header claims
    chunked: bool = False  # sent without Content-Length


def _over_limit(max_bytes: int) -> bytes:
    # One image, measured once: noise_png draws fresh noise on each call, so two calls can differ in length
    # (the body then came out short of the limit whenever an earlier test had drawn noise first).
    head = imagefiles.noise_png(64)
    return head + bytes(max_bytes + 1 - len(head))


CORPUS = [
    Case("PNG 100000x100000", lambda _: imagefiles.png_bomb(), "image/png", 422, "invalid_input", "8192",
         imagefiles.decoded_bytes(100_000, 100_000)),
    Case("JPEG 65500x65500", lambda _: imagefiles.jpeg_bomb(), "image/jpeg", 422, "invalid_input", "8192",
         imagefiles.decoded_bytes(65_500, 65_500)),
    Case("WebP canvas 60000x60000", lambda _: imagefiles.webp_bomb(), "image/webp", 422, "invalid_input", "8192",
         imagefiles.decoded_bytes(60_000, 60_000, 4)),
    Case("PNG 7000x7000 (under Pillow's limit)", lambda _: imagefiles.png_bomb(7000, 7000), "image/png", 422,
         "invalid_input", "40000000", imagefiles.decoded_bytes(7000, 7000)),
    Case("max+1 bytes, Content-Length", _over_limit, "image/png", 413, "payload_too_large", "bytes"),
    Case("max+1 bytes, chunked", _over_limit, "image/png", 413, "payload_too_large", "bytes", chunked=True),
    Case("HTML sent as image/png", lambda _: imagefiles.HTML, "image/png", 415, "unsupported_media_type",
         "PNG, JPEG or WebP"),
    Case("SVG sent as image/png", lambda _: imagefiles.SVG, "image/png", 415, "unsupported_media_type",
         "PNG, JPEG or WebP"),
    Case("GIF", lambda _: imagefiles.gif(), "image/gif", 415, "unsupported_media_type", "GIF"),
    Case("PNG cut inside its header", lambda _: imagefiles.noise_png()[:20], "image/png", 422, "invalid_input",
         "truncated"),
    Case("empty body", lambda _: b"", "image/png", 422, "invalid_input", "empty"),
]


def peak_rss_mb(pid: int) -> float:
    """The process's high-water resident set size (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


async def _in_pieces(data: bytes, piece: int = 256 * 1024) -> AsyncIterator[bytes]:
    for start in range(0, len(data), piece):
        yield data[start : start + piece]


async def send(stack: Stack, case: Case) -> tuple[int, dict, float]:
    body = case.body(stack.settings.upload_max_bytes)
    started = time.perf_counter()
    async with stack.session.post(f"{stack.url}/v1/uploads", data=_in_pieces(body) if case.chunked else body,
                                  headers={**stack.auth, "Content-Type": case.content_type}) as resp:
        answer = await resp.json()
        if case.chunked:
            assert "Content-Length" not in resp.request_info.headers
        return resp.status, answer, (time.perf_counter() - started) * 1000


@pytest.fixture
def settings(tmp_path, database_url, nats_url):
    return stack_settings(tmp_path, database_url, nats_url)


async def test_the_image_bomb_corpus_is_refused_without_the_gateway_growing(settings):
    gateway_only = {name: SERVICES[name] for name in ("fake-provider", "gateway")}
    async with running_stack(settings, services=gateway_only) as stack:
        pid = stack.supervisor.pid("gateway")
        assert pid is not None
        # One ordinary upload first, so the baseline includes everything taking an upload imports.
        warm = await stack.session.post(f"{stack.url}/v1/uploads", data=imagefiles.noise_png(512),
                                        headers={**stack.auth, "Content-Type": "image/png"})
        assert warm.status == 201, await warm.text()
        before = peak_rss_mb(pid)

        results = [(case, *await send(stack, case)) for case in CORPUS]

        after = peak_rss_mb(pid)
        conn = await asyncpg.connect(settings.database_url)
        try:
            stored_rows = await conn.fetchval("SELECT count(*) FROM uploads")
        finally:
            await conn.close()
        stored_files = [p for p in Path(settings.storage_url.removeprefix("file://")).rglob("*")
                        if p.is_file() and p.suffix != ".content-type"]

    print(f"\n{'case':<40} {'status':>6} {'code':<24} {'ms':>8}  declared decoded size")
    assert all(len(case.body(settings.upload_max_bytes)) == settings.upload_max_bytes + 1
               for case in CORPUS if case.name.startswith("max+1"))
    for case, status, answer, ms in results:
        declared = f"{case.declared_decoded / 1e9:,.1f} GB" if case.declared_decoded else ""
        print(f"{case.name:<40} {status:>6} {answer['error']['code']:<24} {ms:>8.1f}  {declared}")
    declared_total = sum(c.declared_decoded for c in CORPUS) / 1e9
    print(f"gateway VmHWM: {before:.1f} MiB before, {after:.1f} MiB after (+{after - before:.1f} MiB); "
          f"the bombs declare {declared_total:,.1f} GB decoded")

    for case, status, answer, _ in results:
        assert (status, answer["error"]["code"]) == (case.status, case.code), (case.name, answer)
        assert case.mentions in answer["error"]["message"], (case.name, answer)
    assert stored_rows == 1 and [p.name for p in stored_files] == ["quarantine"]  # only the warm-up image
    assert after - before < MAX_GROWTH_MB
