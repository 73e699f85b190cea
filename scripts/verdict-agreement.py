"""Does the page's verdict agree with the API's, and is a Run pressed at once during the warm-up kept
from giving one (issue 27)? Starts the app itself on the offline pair, with a fresh cache folder so the
fast path times its layouts as on a new machine, then:

1. opens the page and presses Run as soon as the button is there: the Run waits for the warm-up (or
   says it ran during it) and must give no verdict from figures taken then;
2. once warm, alternates the default Run pressed in a headless browser and the same call through the
   API (gradio_client, no browser), `--rounds` of each, and compares the medians of their
   speculation ÷ plain ratios against the verdict's noise band: the fixed floor (`agree_within_band`,
   ±NOISE_BAND) and the band the page drew its verdicts with (`agree_within_page_band`); `same_verdicts`
   says whether every verdict of both sides was the same word.

    python scripts/verdict-agreement.py --rounds 5 [--first browser|api] [--port 7893] [--keep-cache DIR]

`--first api` makes the call pressed at once an API call (no page drawing beside it), to tell the
warm-up's effect from the browser's.

Run it alone on the machine (it times things). Prints one JSON line at the end.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RATIO = re.compile(r"(?:finished|ran at) ([0-9]+\.[0-9]+)× (?:sooner|the speed)")
PLAIN = re.compile(r"\(([0-9]+\.[0-9]+) tokens/s, measured right after")
LAUNCH = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def wait_up(url: str, limit: float) -> None:
    t0 = time.time()
    while time.time() - t0 < limit:
        try:
            urllib.request.urlopen(url, timeout=5).read(100)
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"the app did not answer at {url} within {limit:.0f} s")


def browser_run(page, limit: float = 300) -> dict:
    """Press Run on the open page and wait for the verdict line; returns what the page said."""
    page.locator("#run").click()
    t0, waited, fresh = time.time(), False, False
    while time.time() - t0 < limit:
        status = page.locator("#status").inner_text()
        text = page.locator("#counters").inner_text()
        waited = waited or "Waiting for the app's warm-up" in status + text
        ended = "No verdict" in text or RATIO.search(text) or "No plain-decoding baseline" in text
        # the last Run's verdict stays on the page until this Run's first step replaces the counters
        fresh = fresh or not ended
        if fresh and ended:
            m, pl = RATIO.search(text), PLAIN.search(text)
            word = ("faster" if "sooner" in text else "slower" if "did not pay" in text
                    else "same" if "about the same" in text else "none")
            band = re.search(r"±([0-9]+)%", text)
            return {"ratio": float(m.group(1)) if m else None, "plain_tokens_per_s": float(pl.group(1)) if pl else None,
                    "verdict": word, "band": int(band.group(1)) / 100 if band else None, "no_verdict": "No verdict" in text,
                    "waited_for_warmup": waited, "seconds": round(time.time() - t0, 1)}
        page.wait_for_timeout(250)
    return {"ratio": None, "timed_out": True, "waited_for_warmup": waited}


def api_run(url: str) -> dict:
    from gradio_client import Client
    res = Client(url, verbose=False).submit(api_name="/generate").result()
    found = [x for x in (res if isinstance(res, (list, tuple)) else [res]) if isinstance(x, dict) and "verdict" in x]
    r = found[0] if found else {}
    return {"ratio": r.get("speedup_vs_plain"), "plain_tokens_per_s": r.get("plain_tokens_per_s"),
            "tokens_per_s": r.get("tokens_per_s"), "verdict": r.get("verdict"), "band": r.get("noise_band"), "during_warmup": r.get("during_warmup")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--port", type=int, default=7893)
    ap.add_argument("--first", choices=("browser", "api"), default="browser")
    ap.add_argument("--keep-cache", help="a cache folder to use (default: a fresh one, removed after)")
    args = ap.parse_args()
    url = f"http://127.0.0.1:{args.port}/"
    cache = args.keep_cache or tempfile.mkdtemp(prefix="specviz-cache-")
    env = dict(os.environ, SPECVIZ_CACHE=cache, HF_HUB_OFFLINE="1")
    log = open(os.path.join(tempfile.gettempdir(), "verdict-agreement-app.log"), "w")
    app = subprocess.Popen([sys.executable, "app.py", "--port", str(args.port)], env=env, stdout=log, stderr=log)
    out: dict = {"cache": "fresh" if not args.keep_cache else cache}
    try:
        from playwright.sync_api import sync_playwright
        wait_up(url, 600)
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=shutil.which("chromium"), args=LAUNCH)
            page = b.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url + "?tab=playground")
            page.wait_for_selector("#run", timeout=120000)
            out["first_run"] = browser_run(page) if args.first == "browser" else api_run(url)   # at once
            print("first run:", out["first_run"], flush=True)
            rounds = {"browser": [], "api": []}
            for i in range(args.rounds):                   # alternated, so drift hits both sides alike
                rounds["browser"].append(browser_run(page))
                rounds["api"].append(api_run(url))
                print(f"round {i + 1}:", rounds["browser"][-1], rounds["api"][-1], flush=True)
            b.close()
        ratios = {k: [r["ratio"] for r in v if r.get("ratio")] for k, v in rounds.items()}
        med = {k: statistics.median(v) if v else None for k, v in ratios.items()}
        out.update(rounds=rounds, median=med, ratios=ratios)
        if med["browser"] and med["api"]:
            from specviz.ui.counters import NOISE_BAND
            out["browser_over_api"] = med["browser"] / med["api"]
            out["agree_within_band"] = abs(out["browser_over_api"] - 1) <= NOISE_BAND
            # the band the page's verdicts were drawn with (measured from this session's baselines, never
            # below NOISE_BAND): the one a reader of the page is told the figure carries
            bands = [r["band"] for r in rounds["browser"] if r.get("band")]
            if bands:
                out["page_band"] = statistics.median(bands)
                out["agree_within_page_band"] = abs(out["browser_over_api"] - 1) <= out["page_band"]
        out["verdicts"] = {k: [r.get("verdict") for r in v] for k, v in rounds.items()}
        out["same_verdicts"] = len({v for r in rounds.values() for v in (x.get("verdict") for x in r)}) == 1
    finally:
        app.terminate()
        app.wait(30)
        if not args.keep_cache:
            shutil.rmtree(cache, ignore_errors=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
