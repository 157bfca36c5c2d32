"""Screenshots of documentation pages as a reader sees them, with headless Chromium.

    python tools/docs_screenshots.py [OUT_DIR] [--pages PATH ...] [--widths 1280,800]
                                     [--height 2400]

Builds the site (``mkdocs build --strict`` into a temporary folder), serves it on 127.0.0.1 (so
search works as with ``mkdocs serve``) and writes ``OUT_DIR/<page>-<width>.png`` (default OUT_DIR:
``docs_screenshots`` in the system's temporary folder) for each page and width (default: the pages
whose layout matters most: the config reference, getting started, Run on Ray, Stream Parquet
shards, sweeps, the GPT example). Each image is the top ``--height`` pixels of the page. Scrollbars
are left visible, so a code block or table that scrolls sideways shows its bar; one cut off at the
right without a bar is clipped. Needs ``chromium`` (``apt-get install chromium``) and the ``docs``
extra. Look at the images: a command cut off at the right, a table column without a header or a
key broken mid-word is what this is for.
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
         "how-to/streaming-data/", "how-to/sweeps/", "how-to/gpt-example/"]


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the built site without a log line per request."""

    def log_message(self, format: str, *args: object) -> None:
        pass


def build_site(out: Path) -> None:
    """``mkdocs build --strict`` into ``out``; a failed build ends the script with its reason."""
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"mkdocs build --strict failed ({last}): run it in {ROOT} to see all")


def serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serves ``folder`` on a free port of 127.0.0.1 from a daemon thread; returns its base URL."""
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def shoot(browser: str, url: str, target: Path, width: int, height: int) -> None:
    """Writes the top ``width`` x ``height`` pixels of ``url`` to ``target``."""
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu",
           f"--window-size={width},{height}", f"--screenshot={target}", url]
    by_hand = f"try it by hand: {' '.join(cmd)}"
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"chromium took over 120 s on {url}: {by_hand}") from None
    except subprocess.CalledProcessError as e:
        last = (e.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"chromium failed on {url} ({last}): {by_hand}") from e


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default=str(Path(tempfile.gettempdir()) / "docs_screenshots"),
                   help="folder for the PNG files (created)")
    p.add_argument("--pages", nargs="+", default=PAGES, help="site paths, e.g. how-to/sweeps/")
    p.add_argument("--widths", default="1280,800", help="window widths in px, comma-separated")
    p.add_argument("--height", type=int, default=2400, help="window height in px (default 2400)")
    args = p.parse_args(argv)
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("chromium not found: apt-get install chromium")
    widths = [int(w) for w in args.widths.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as site:
        build_site(Path(site))
        missing = [p for p in args.pages if not Path(site, p.strip("/"), "index.html").is_file()]
        if missing:
            raise SystemExit(f"no page {missing[0]!r} in the built site: give its URL path, "
                             "e.g. how-to/sweeps/")
        server, base = serve(Path(site))
        try:
            for page in args.pages:
                name = page.strip("/").replace("/", "_") or "index"
                for width in widths:
                    shoot(browser, base + page, out / f"{name}-{width}.png", width, args.height)
                    print(out / f"{name}-{width}.png")
        finally:
            server.shutdown()


if __name__ == "__main__":
    main()
