"""Headless Chromium (the OS package, scripts/install-browser.sh) driven by Selenium, for the report tests.

``open_page`` loads a file at 1280 x 800 and returns what a reader of that screen would see: page
width, images that failed to load, console errors, and the position of elements by id. Tests skip
with the reason when Chromium, its driver or the selenium package is missing; .ci/run installs them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

WIDTH, HEIGHT = 1280, 800
PHONE_WIDTH = 390  # a phone held upright (CSS pixels)


def _binaries() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("headless Chromium is not installed (scripts/install-browser.sh installs chromium and "
                    "chromium-driver; .ci/run calls it)")
    return chromium, driver


@contextmanager
def browser(width: int = WIDTH) -> Iterator[Any]:
    """A headless Chromium ``width`` x 800 (1280 unless told) with its console log kept."""
    chromium, driver = _binaries()
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (requirements-test.txt)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{HEIGHT}", "--hide-scrollbars"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # Chromium leaves a folder for its singleton socket in the temp folder at every start: give it
    # one of its own, removed after.
    with tempfile.TemporaryDirectory(prefix="test-chromium-") as temp:
        drv = webdriver.Chrome(service=Service(driver, env={**os.environ, "TMPDIR": temp}), options=options)
        try:
            drv.set_window_size(width, HEIGHT)
            yield drv
        finally:
            drv.quit()


def inspect_page(drv: Any, page: Path, screenshot: Path) -> dict[str, Any]:
    """Load ``page`` and measure it; saves a first-screen and a full-page screenshot beside ``screenshot``.

    Besides positions: ``cut_off``, elements reaching past the window's right edge outside any box
    of their own that scrolls; ``tables_overflow``, tables wider than their box (they scroll);
    ``links``, every link's resolved address; ``image_alts``, the images' alt texts."""
    drv.get(page.resolve().as_uri())
    drv.execute_script("return document.readyState")
    facts = drv.execute_script(
        """
        const imgs = Array.from(document.images);
        const pos = {};
        for (const el of document.querySelectorAll('[id]')) {
          const r = el.getBoundingClientRect();
          pos[el.id] = {top: r.top, bottom: r.bottom, left: r.left, right: r.right, text: el.textContent,
                        value: el.dataset.value === undefined ? null : el.dataset.value};
        }
        return {scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth,
                images: imgs.length, broken: imgs.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.alt),
                widest: Math.max(0, ...Array.from(document.body.querySelectorAll('*')).map(e => e.getBoundingClientRect().right)),
                external: Array.from(document.querySelectorAll('script[src],link[href],img[src^="http"],iframe')).length,
                tables: Array.from(document.querySelectorAll('table')).map(t => getComputedStyle(t.parentElement).overflowX),
                tables_overflow: Array.from(document.querySelectorAll('table')).filter(
                  t => t.parentElement.scrollWidth > t.parentElement.clientWidth + 1).map(t => t.id || '(no id)'),
                cut_off: Array.from(document.body.querySelectorAll('*')).filter(e => {
                  if (e.getBoundingClientRect().right <= window.innerWidth + 1) return false;
                  for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
                    if (['auto', 'scroll', 'hidden'].includes(getComputedStyle(a).overflowX)) return false;
                  }
                  return true;
                }).map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + (e.className ? '.' + e.className : '')),
                links: Array.from(document.links).map(a => a.href),
                image_alts: imgs.map(i => i.alt),
                pos: pos};
        """
    )
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    drv.save_screenshot(str(screenshot))
    width = int(drv.execute_script("return window.innerWidth"))
    full_height = drv.execute_script("return document.documentElement.scrollHeight")
    drv.set_window_size(width, min(int(full_height) + 100, 16000))
    drv.save_screenshot(str(screenshot.with_name(screenshot.stem + "-full.png")))
    drv.set_window_size(width, HEIGHT)
    facts["console_errors"] = [e for e in drv.get_log("browser") if e.get("level") == "SEVERE"]
    return facts
