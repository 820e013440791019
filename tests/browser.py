"""Headless Chromium for the report's tests: Debian's ``chromium`` driven by Playwright for Python.

Playwright is pointed at the system executable (``executable_path``); its own browser downloads are never used.
Tests that need the browser are skipped, with the reason, only when no Chromium executable is installed
(``bash scripts/setup.sh --test`` installs Debian's package). :class:`PageWatch` records what a person would
not see but a test must check: console errors, uncaught exceptions, and every request the page makes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser")


def chromium_path() -> str | None:
    """The Chromium executable: ``$DZ_GYM_CHROMIUM`` or Debian's ``chromium`` on PATH."""
    explicit = os.environ.get("DZ_GYM_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    for name in CHROMIUM_CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


class PageWatch:
    """Console errors, page errors and request URLs of one page."""

    def __init__(self, page):
        self.page = page
        self.errors: list[str] = []
        self.requests: list[str] = []
        page.on(
            "console",
            lambda msg: (
                self.errors.append(f"console.{msg.type}: {msg.text}") if msg.type in ("error", "warning") else None
            ),
        )
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        page.on("requestfailed", lambda req: self.errors.append(f"request failed: {req.url}"))
        page.on("request", lambda req: self.requests.append(req.url))

    def foreign_requests(self) -> list[str]:
        """Requests that would leave the file system (anything but ``file://``)."""
        return [url for url in self.requests if not url.startswith("file://")]


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium per test module."""
    executable = chromium_path()
    if executable is None:
        pytest.skip("Chromium is not installed (bash scripts/setup.sh --test installs Debian's chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright (Python) is not installed: bash scripts/setup.sh --test installs the test extra")
    with sync_playwright() as p:
        instance = p.chromium.launch(
            executable_path=executable,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--autoplay-policy=no-user-gesture-required",
            ],
        )
        try:
            yield instance
        finally:
            instance.close()


@pytest.fixture
def open_page(browser):
    """``open_page(path) -> (page, watch)``: a fresh page on ``file://path``, ready when its script has run."""
    contexts = []

    def _open(path: Path, *, width: int = 1400, height: int = 1000):
        context = browser.new_context(viewport={"width": width, "height": height})
        contexts.append(context)
        page = context.new_page()
        watch = PageWatch(page)
        page.goto(Path(path).resolve().as_uri())
        page.wait_for_function("window.dzReport && window.dzReport.ready", timeout=30_000)
        return page, watch

    yield _open
    for context in contexts:
        context.close()
