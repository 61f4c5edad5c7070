"""A real browser for the dashboard's end-to-end tests: Debian's chromium, driven by
Playwright. Outside CI a machine without it skips those tests with a one-line reason; in CI
(`CI=true`) a missing browser fails them. Screenshots go to the run's artifacts
(`DL_TEST_ARTIFACTS`, by default `.test-artifacts/` at the repository's root)."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from .procs import Launcher, ServiceProcess

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(
    os.environ.get("DL_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / ".test-artifacts")
)


def require_chromium() -> None:
    """Skip (fail in CI) when the browser or its driver is missing."""
    missing = None
    if not CHROMIUM.exists():
        missing = f"{CHROMIUM} is missing (apt-get install chromium)"
    else:
        try:
            import playwright  # noqa: F401
        except ImportError:
            missing = "Playwright is missing (pip install -e '.[test]')"
    if missing is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the dashboard's browser tests need a browser: {missing}")
        pytest.skip(missing)


async def open_browser() -> AsyncIterator[object]:
    """A headless chromium (the `Browser` of Playwright's async API)."""
    from playwright.async_api import async_playwright

    async with async_playwright() as driver:
        browser = await driver.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            yield browser
        finally:
            await browser.close()


async def screenshot(page: object, name: str) -> Path:
    """Save what `page` shows under the artifacts, as `name`.png."""
    await asyncio.to_thread(ARTIFACTS.mkdir, parents=True, exist_ok=True)
    path = ARTIFACTS / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.png"
    await page.screenshot(path=str(path), full_page=True)  # type: ignore[attr-defined]
    return path


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    """A headless chromium for a test (skipped, or failed in CI, without one)."""
    require_chromium()
    async for opened in open_browser():
        yield opened


async def a_service(launcher: Launcher, dsn: str, **env: str) -> ServiceProcess:
    """A service process, healthy, that accepts tasks no live process knows (the pages'
    jobs need no worker)."""
    service = launcher.start(dsn, DL_ALLOW_UNKNOWN_TASKS="true", **env)
    await service.wait_healthy()
    return service
