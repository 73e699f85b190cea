"""What a Playground Run costs the page: chromium's busy time (CDP Performance metrics) while one Run of
512 tokens (batch 4, depth 4, the tests' tiny random pair, then its plain-decoding baseline) streams into
a headless page, and the size of the token view it ends with. On 2 cores the page competes with the
server, so a lighter page lets the Run run. Run it alone (no tests, no other browser).
Usage: .venv/bin/python scripts/page-cost.py [--runs 6]"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from apphelp import start_app, stop_app  # noqa: E402
from test_app import browser_page  # noqa: E402
from tiny import build_pair  # noqa: E402

STATUS = "document.querySelector('#status').innerText"


def metrics(cdp) -> dict:
    return {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}


def one_run(page, cdp) -> tuple[float, float, float, int]:
    """(wall s, page busy s, of it script s, token view bytes) of one press of Run until "Done"."""
    before, t0 = metrics(cdp), time.perf_counter()
    page.locator("#run").click()
    page.wait_for_function(f"!{STATUS}.includes('Done')", timeout=60000)
    page.wait_for_function(f"{STATUS}.includes('Done')", timeout=300000)
    wall, after = time.perf_counter() - t0, metrics(cdp)
    size = page.evaluate("document.querySelector('#tokens').innerHTML.length")
    return (wall, after["TaskDuration"] - before["TaskDuration"], after["ScriptDuration"] - before["ScriptDuration"],
            size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=6)
    runs = ap.parse_args().runs
    work = Path(tempfile.mkdtemp(prefix="specviz-page-cost-"))
    paths = build_pair(work / "pair")
    proc, url = start_app(paths["target"], paths["draft"], work / "app.log")
    try:
        with browser_page(1300) as page:
            cdp = page.context.new_cdp_session(page)
            cdp.send("Performance.enable")
            page.goto(url + "?tab=playground")
            page.wait_for_selector("#run", timeout=60000)
            page.locator("#max-new-tokens input[type=number]").fill("512")
            page.locator("#max-new-tokens input[type=number]").press("Enter")
            got = []
            for n in range(runs):
                time.sleep(2)
                got.append(one_run(page, cdp))
                wall, busy, script, size = got[-1]
                print(f"run {n}: {wall:.1f} s, page busy {busy:.2f} s (script {script:.2f} s), "
                      f"token view {size / 1000:.0f} kB", flush=True)
            busy = [b for _, b, _, _ in got]
            print(f"page busy per Run: median {statistics.median(busy):.2f} s, {min(busy):.2f}-{max(busy):.2f} s")
    finally:
        stop_app(proc)


if __name__ == "__main__":
    main()
