"""Screenshots of every docs page in headless Chromium, and a check that no code block or table
is wider than the page (issues 17 and 33).

Builds the site (mkdocs), serves it on 127.0.0.1, and for each page writes
``<out>/<page>.png`` (``--width`` x 2400 px) and reads, through
``docs/javascripts/overflow_check.js``, which code blocks and tables overflow the content column
and how many characters of code a line of the column holds. Exits 1 when something overflows.

The width is 1366 px by default, the most common laptop screen: at 1440 px three code blocks of
the loggers page fitted while a reader at 1366 px saw them cut. There a code line holds 98
characters; ``tests/test_docs_site.py`` checks that bound on the Markdown sources in every run of
the suite (``CODE_COLUMNS``), this script checks the rendered pages (tables too).

Run: .venv/bin/python scripts/docs_screenshots.py [--out site-screens] [--width 1366]
[--chromium /usr/bin/chromium] (needs Debian's chromium: apt-get install -y chromium)
"""

from __future__ import annotations

import argparse
import functools
import html
import http.server
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Every page of the site (a page left out is a page whose overflow nobody sees).
PAGES = tuple(sorted(path.stem for path in (ROOT / "docs").glob("*.md")))
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars")


def build_site(target: Path) -> None:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    subprocess.run([str(mkdocs), "build", "--quiet", "--site-dir", str(target)], cwd=ROOT, check=True,
                   env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})


def serve(directory: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def chromium(binary: str, profile: Path, width: int, *arguments: str) -> str:
    result = subprocess.run([binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},2400",
                             *arguments], capture_output=True, text=True, timeout=120)
    return result.stdout


def page_url(base: str, page: str) -> str:
    return f"{base}/" if page == "index" else f"{base}/{page}/"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "site-screens"), help="where the PNGs go")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument("--width", type=int, default=1366, help="window width in px")
    parser.add_argument("--pages", nargs="+", default=PAGES, help="pages to check (default: all)")
    options = parser.parse_args(argv)
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    failures = 0
    with tempfile.TemporaryDirectory() as temp:
        site, profile = Path(temp) / "site", Path(temp) / "profile"
        build_site(site)
        server, base = serve(site)
        try:
            for page in options.pages:
                url = page_url(base, page)
                screenshot = f"--screenshot={out / (page + '.png')}"
                chromium(options.chromium, profile, options.width, screenshot, url)
                dom = chromium(options.chromium, profile, options.width, "--virtual-time-budget=3000",
                               "--dump-dom", url + "?overflow-check")
                match = re.search(r'data-overflow="([^"]*)"', dom)
                if match is None:
                    print(f"{page}: overflow check did not run")
                    failures += 1
                    continue
                wide = json.loads(html.unescape(match.group(1)))
                columns = re.search(r'data-code-columns="(\d+)"', dom)
                height = re.search(r'data-height="(\d+)"', dom)
                failures += bool(wide)
                print(f"{page}: {out / (page + '.png')}; "
                      + (f"{len(wide)} too wide: {wide}" if wide else "nothing too wide")
                      + (f"; a code line holds ~{columns.group(1)} characters" if columns else "")
                      + (f"; {height.group(1)} px tall" if height else ""))
        finally:
            server.shutdown()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
