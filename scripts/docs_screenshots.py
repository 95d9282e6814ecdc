"""Screenshots of the main docs pages in headless Chromium, and a check that no code block or
table is wider than the page (issue 17).

Builds the site (mkdocs), serves it on 127.0.0.1, and for each page writes
``<out>/<page>.png`` (1440 x 2400 px) and reads, through ``docs/javascripts/overflow_check.js``,
which code blocks and tables overflow the content column. Exits 1 when one does.

Run: .venv/bin/python scripts/docs_screenshots.py [--out site-screens] [--chromium /usr/bin/chromium]
(needs Debian's chromium: apt-get install -y chromium)
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
PAGES = ("index", "quickstart", "which_callback", "early_stopping", "resume", "train_subset", "api")
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


def chromium(binary: str, profile: Path, *arguments: str) -> str:
    result = subprocess.run([binary, *FLAGS, f"--user-data-dir={profile}", "--window-size=1440,2400",
                             *arguments], capture_output=True, text=True, timeout=120)
    return result.stdout


def page_url(base: str, page: str) -> str:
    return f"{base}/" if page == "index" else f"{base}/{page}/"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "site-screens"), help="where the PNGs go")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    options = parser.parse_args(argv)
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    failures = 0
    with tempfile.TemporaryDirectory() as temp:
        site, profile = Path(temp) / "site", Path(temp) / "profile"
        build_site(site)
        server, base = serve(site)
        try:
            for page in PAGES:
                url = page_url(base, page)
                chromium(options.chromium, profile, f"--screenshot={out / (page + '.png')}", url)
                dom = chromium(options.chromium, profile, "--virtual-time-budget=3000", "--dump-dom",
                               url + "?overflow-check")
                match = re.search(r'data-overflow="([^"]*)"', dom)
                if match is None:
                    print(f"{page}: overflow check did not run")
                    failures += 1
                    continue
                wide = json.loads(html.unescape(match.group(1)))
                failures += bool(wide)
                print(f"{page}: {out / (page + '.png')}; " + (f"{len(wide)} too wide: {wide}" if wide
                                                                 else "nothing too wide"))
        finally:
            server.shutdown()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
