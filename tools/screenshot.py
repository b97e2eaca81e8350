"""A page of the leaderboard app (or of a static site) as Chromium renders it, saved as a PNG
(the docs' images).

    python tools/screenshot.py --db URL --out docs/img/leaderboard.png [--page /grid] [--wait TEXT]
    python tools/screenshot.py --file SITE/index.html --out docs/img/site.png

Starts `bench leaderboard --db URL` on a free port (or opens the file), opens the page in
headless Chromium (Debian's chromium and chromedriver, driven by Selenium, as
tests/leaderboard/test_browser.py), waits until the page shows TEXT (default: the summary line's "cells"),
and saves the window.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(url: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench.cli", "leaderboard", "--db", url, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(f"{base}/_stcore/health", timeout=2).status == 200:
                return proc, base
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("bench leaderboard did not come up within 60 s")


def chromium(width: int, height: int):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", f"--window-size={width},{height}"):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=opts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", help="SQLAlchemy URL of the store to show")
    ap.add_argument("--file", type=Path, help="a static page to show instead (bench publish's index.html)")
    ap.add_argument("--out", required=True, type=Path, help="the PNG to write")
    ap.add_argument("--page", default="/", help="the app's path, e.g. /grid or /run?run=ID")
    ap.add_argument("--wait", default="cells", help="text the page shows once drawn")
    ap.add_argument("--size", default="1500x1100", help="window WIDTHxHEIGHT")
    args = ap.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    if (args.db is None) == (args.file is None):
        raise SystemExit("give --db URL (the app) or --file PAGE (a static page)")
    proc, base = serve(args.db) if args.db else (None, None)
    driver = chromium(width, height)
    try:
        driver.get(args.file.resolve().as_uri() if args.file else base + args.page)
        deadline = time.time() + 90
        while args.wait not in driver.find_element("tag name", "body").text:
            if time.time() > deadline:
                raise SystemExit(f"{args.wait!r} never showed on {args.page}")
            time.sleep(0.3)
        time.sleep(2)                    # the charts draw after the text
        args.out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(args.out))
        print(f"{args.out}: {args.out.stat().st_size:,} bytes")
    finally:
        driver.quit()
        if proc is not None:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
