"""Real headless Chromium (Debian's package) driven by Playwright against the live test server.

Screenshots of every page a test visits go to test-artifacts/screenshots/ (kept after the run, for people to look at).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, sync_playwright

from tests.conftest import PROJECT_DIR

# Playwright's sync API runs an event loop in this thread; Django then refuses ORM calls from it unless told that the
# test's own (synchronous) database access is fine.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

STATIC_RESOURCES = ("script", "stylesheet", "image", "font", "media")
SCREENSHOTS = PROJECT_DIR / "test-artifacts" / "screenshots"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def browser():
    executable = shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, live_server) -> Page:
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(f"script error: {error}"))
    page.on(
        "console",
        lambda message: (
            message.type == "error"
            and not message.text.startswith("Failed to load resource")  # reported below, with its URL
            and errors.append(f"console: {message.text}")
        ),
    )
    page.on(
        "response",
        lambda response: (
            # 5xx anywhere; 4xx only for a missing script, stylesheet or image — 4xx pages and form answers (an htmx
            # 400 with the form's errors, a 404 opened on purpose) are the app's own
            (response.status >= 500 or (response.status >= 400 and response.request.resource_type in STATIC_RESOURCES))
            and errors.append(f"{response.status} for {response.url}")
        ),
    )
    yield page
    context.close()
    assert not errors, f"the pages logged errors: {errors}"  # a broken script or a missing file is a bug


@pytest.fixture
def shot(page: Page, request):
    """shot("name") saves a full-page screenshot named after the test and the step."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    prefix = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name)

    def save(name: str) -> Path:
        path = SCREENSHOTS / f"{prefix}--{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return save


def log_in(page: Page, username: str, password: str) -> None:
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(re.compile(r"^(?!.*/accounts/login/).*$"))


def to_resource_step(page: Page, wheel: Path, parameters: dict[str, str] | None = None) -> None:
    """Through the wizard's first two steps: `wheel` with its `parameters` (in the rows the page shows), then the
    built-in digits; ends on the Resource step."""
    page.goto("/jobs/new/")
    page.get_by_label("Wheel bundle (.whl)").set_input_files(str(wheel))
    for number, (name, value) in enumerate((parameters or {}).items(), start=1):
        page.get_by_role("textbox", name=f"Name of parameter {number}").fill(name)
        page.get_by_role("textbox", name=f"Value of parameter {number}").fill(value)
    page.get_by_role("button", name=re.compile("^Next")).click()
    page.wait_for_url(re.compile(r"/jobs/new/data/"))
    page.locator("label.wz-card", has_text="Digits").click()
    page.get_by_role("button", name=re.compile("^Next")).click()
    page.wait_for_url(re.compile(r"/jobs/new/resource/"))


@contextlib.contextmanager
def redrawn(page: Page) -> Iterator[None]:
    """Wait, after the block, until htmx has drawn the wizard's step anew, as a change of provider, workload or
    catalogue does (the old #wizard is swapped out whole), and settled it. `wait_for_load_state` cannot tell: the page
    reached its load states long before, and a field chosen before the new step arrives is lost with the old one.
    Nor is the swap enough: htmx listens on the new step's elements only once it settles (settleDelay, 20 ms, later;
    until then they carry the class htmx-settling), and a field chosen in between asks the panel for nothing."""
    before = page.locator("#wizard").element_handle()
    yield
    before.wait_for_element_state("hidden")
    page.locator(".htmx-settling").first.wait_for(state="detached")
