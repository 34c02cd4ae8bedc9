"""Open the built API reference in headless Chromium: the index and one estimator's page must render their
navigation and code blocks (queried in the browser's DOM, after its scripts and styles), and the estimator's page
is saved as ``docs/figures/api_reference.png``.

    python -m sphinx -W --keep-going -b html docs docs/_build/html
    python benchmarks/docs_screenshot.py [--html docs/_build/html] [--output docs/figures/api_reference.png]

Chromium is Debian's (``apt-get install chromium``) or any Chrome given by ``--browser``; it is driven through the
DevTools protocol on a pipe (``--remote-debugging-pipe``), so nothing but the standard library is needed. Exits 1
with the failed checks listed.
"""

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ESTIMATOR = "generated/skflow.Whitener.html"

# What a reader sees, measured in the page: visible boxes (non-zero size, not display:none), highlighted code.
PROBE = """(() => {
  const shown = el => { const r = el.getBoundingClientRect(), s = getComputedStyle(el);
                        return r.width > 0 && r.height > 0 && s.display !== 'none' && s.visibility !== 'hidden'; };
  const links = sel => [...document.querySelectorAll(sel)].filter(shown).map(a => a.getAttribute('href'));
  const code = [...document.querySelectorAll('div.highlight pre')].filter(shown);
  return {
    title: document.title,
    header_links: links('header.bd-header a.nav-link'),
    section_links: links('nav.bd-docs-nav a'),
    breadcrumbs: links('nav[aria-label=Breadcrumb] a'),
    on_this_page: links('nav.page-toc a'),
    code_blocks: code.map(pre => pre.textContent.slice(0, 400)),
    code_font: code.length ? getComputedStyle(code[0]).fontFamily : '',
    code_colours: code.length ? new Set([...code[0].querySelectorAll('span')].map(
      s => getComputedStyle(s).color)).size : 0,
    theme_css: [...document.styleSheets].some(s => (s.href || '').includes('pydata-sphinx-theme')),
  };
})()"""


class Browser:
    """Headless Chromium over the DevTools protocol on file descriptors 3 (its input) and 4 (its output)."""

    def __init__(self, executable: str):
        to_chrome, self._send = os.pipe()
        self._receive, from_chrome = os.pipe()

        def fds():  # in the child: the pipe's ends where --remote-debugging-pipe expects them, inheritable
            reads, writes = os.dup(to_chrome), os.dup(from_chrome)  # above 4, so that neither overwrites the other
            os.dup2(reads, 3)
            os.dup2(writes, 4)

        flags = ["--headless", "--remote-debugging-pipe", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                 f"--user-data-dir={tempfile.mkdtemp(prefix='skflow-chromium-')}"]
        if os.geteuid() == 0:
            flags.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox
        self.process = subprocess.Popen([executable, *flags, "about:blank"], preexec_fn=fds, close_fds=False,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome)
        os.close(from_chrome)
        self._buffer, self._id, self.session = b"", 0, None

    def call(self, method: str, timeout: float = 30, **params):
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._send, json.dumps(message).encode() + b"\0")
        return self._wait(lambda m: m.get("id") == self._id, timeout)

    def event(self, name: str, timeout: float = 30):
        return self._wait(lambda m: m.get("method") == name, timeout)

    def _wait(self, wanted, timeout: float):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                message = json.loads(raw)
                if wanted(message):
                    if "error" in message:
                        raise RuntimeError(f"Chromium: {message['error']}")
                    return message.get("result", message.get("params"))
            chunk = os.read(self._receive, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe")
            self._buffer += chunk
        raise TimeoutError("Chromium did not answer in time")

    def open(self, path: Path, width: int, height: int) -> dict:
        if self.session is None:
            target = self.call("Target.createTarget", url="about:blank")["targetId"]
            self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            self.call("Page.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        self.call("Page.navigate", url=path.resolve().as_uri())
        self.event("Page.loadEventFired")
        self.call("Runtime.evaluate", expression="document.fonts.ready", awaitPromise=True)
        return self.call("Runtime.evaluate", expression=PROBE, returnByValue=True)["result"]["value"]

    def screenshot(self, output: Path) -> None:
        output.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def problems(page: str, seen: dict, navigation: dict[str, list[str]], code: str) -> list[str]:
    found = []
    for where, hrefs in navigation.items():
        missing = [href for href in hrefs if href not in seen[where]]
        if missing:
            found.append(f"{page}: {where} lacks {missing} (shown: {seen[where]})")
    if not any(code in text for text in seen["code_blocks"]):
        found.append(f"{page}: no visible code block with {code!r} (shown: {seen['code_blocks']})")
    if "mono" not in seen["code_font"].lower():
        found.append(f"{page}: code not in a monospace font ({seen['code_font']!r})")
    if seen["code_colours"] < 3:
        found.append(f"{page}: code not highlighted ({seen['code_colours']} colours)")
    if not seen["theme_css"]:
        found.append(f"{page}: the PyData theme's stylesheet is not loaded")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--html", type=Path, default=ROOT / "docs" / "_build" / "html")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "figures" / "api_reference.png")
    parser.add_argument("--browser", default=shutil.which("chromium") or shutil.which("google-chrome"))
    args = parser.parse_args(argv)
    if not args.browser:
        sys.exit("no Chromium found: apt-get install chromium, or give --browser PATH")
    if not (args.html / ESTIMATOR).is_file():
        sys.exit(f"{args.html / ESTIMATOR}: not built; run python -m sphinx -W --keep-going -b html docs {args.html}")
    browser = Browser(args.browser)
    try:
        index = browser.open(args.html / "index.html", 1400, 900)
        found = problems("index.html", index, {"header_links": ["api.html", "embedder.html", "flow.html"]},
                         "Whitener().fit(pairs)")
        estimator = browser.open(args.html / ESTIMATOR, 1400, 900)
        found += problems(ESTIMATOR, estimator, {
            "header_links": ["../api.html", "../embedder.html"],
            "breadcrumbs": ["../index.html", "../api.html"],
            "section_links": ["skflow.FlowGaussianizer.html", "skflow.Quantizer.html"],
            "on_this_page": ["#skflow.Whitener.fit", "#skflow.Whitener.transform"],
        }, ">>> from skflow import Whitener")
        args.output.parent.mkdir(parents=True, exist_ok=True)
        browser.screenshot(args.output)
    finally:
        browser.close()
    for page, seen in (("index.html", index), (ESTIMATOR, estimator)):
        print(f"{page}: {seen['title']!r}, {len(seen['header_links'])} header links, "
              f"{len(seen['section_links'])} section links, {len(seen['on_this_page'])} on this page, "
              f"{len(seen['code_blocks'])} code blocks ({seen['code_colours']} colours, {seen['code_font']})")
    print(f"screenshot: {args.output}")
    for problem in found:
        print("FAILED:", problem)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
