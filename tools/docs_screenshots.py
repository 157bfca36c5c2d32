"""Screenshots of documentation pages as a reader sees them, with headless Chromium.

    python tools/docs_screenshots.py [OUT_DIR] [--pages PATH ...] [--widths 1280,800]

Builds the site (``mkdocs build --strict`` into a temporary folder), serves it on 127.0.0.1 (so
search works as with ``mkdocs serve``) and writes ``OUT_DIR/<page>-<width>.png`` for each page and
width (default: the pages whose layout matters most: the config reference, getting started, Run on
Ray, Stream Parquet shards, sweeps). Needs ``chromium`` (``apt-get install chromium``) and the
``docs`` extra. Look at the images: a command cut off at the right, a table column without a
header or a key broken mid-word is what this is for.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["reference/config/", "getting-started/", "how-to/run-on-ray/",
         "how-to/streaming-data/", "how-to/sweeps/"]


def build_site(out: Path) -> None:
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
                   cwd=ROOT, check=True)


def serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def shoot(browser: str, url: str, target: Path, width: int) -> None:
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={width},2400", f"--screenshot={target}", url],
                   check=True, capture_output=True, timeout=120)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default="docs_screenshots")
    p.add_argument("--pages", nargs="+", default=PAGES)
    p.add_argument("--widths", default="1280,800")
    args = p.parse_args(argv)
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("chromium not found: apt-get install chromium")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as site:
        build_site(Path(site))
        server, base = serve(Path(site))
        try:
            for page in args.pages:
                for width in (int(w) for w in args.widths.split(",")):
                    name = page.strip("/").replace("/", "_") or "index"
                    shoot(browser, base + page, out / f"{name}-{width}.png", width)
                    print(out / f"{name}-{width}.png")
        finally:
            server.shutdown()


if __name__ == "__main__":
    main()
