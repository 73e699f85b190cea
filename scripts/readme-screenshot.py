"""Screenshot the playground for the README (headless Debian chromium): after a live Run, or replaying
the shipped recording of the default Run (what the README shows: the same picture on every machine).

    python app.py --port 7891 &        # wait until the fast path serves (see the log), on a quiet machine
    python scripts/readme-screenshot.py http://127.0.0.1:7891/ /tmp/run.png light [live|replay]   # or: dark
Then crop the PNG's top to about 1800 px and look at it before committing it as assets/screenshot.png.
"""
import shutil, sys, time
from playwright.sync_api import sync_playwright
url, out, theme = sys.argv[1], sys.argv[2], sys.argv[3]
mode = sys.argv[4] if len(sys.argv) > 4 else "live"
with sync_playwright() as p:
    b = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
    page = b.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url + "?tab=playground" + ("&batch=2" if mode == "live" else "") + ("&__theme=dark" if theme == "dark" else ""))
    page.wait_for_selector("#run", timeout=60000)
    page.wait_for_timeout(3000)
    if mode == "replay":
        page.locator("#replay-pick input").click()
        page.locator("ul[role=listbox] li", has_text="n-gram draft").first.click()
        page.locator("#replay").click()
        page.wait_for_function("document.querySelector('#status').innerText.includes('Replay')", timeout=60000)
        # the replay plays at its recorded pace; it has ended when the row line says why it finished
        page.wait_for_function("document.querySelector('#rows') && document.querySelector('#rows').innerText.includes('finished')", timeout=120000)
    else:
        page.locator("#run").click()
        page.wait_for_selector("#tokens span.tok-bonus", timeout=120000)
        t0 = time.time()
        while time.time() - t0 < 150:
            txt = page.locator("#counters").inner_text() + page.locator("#status").inner_text()
            if "sooner" in txt or "slower" in txt:
                break
            page.wait_for_timeout(1000)
    page.wait_for_timeout(2500)
    print(page.locator("#status").inner_text()[:300])
    print(page.locator("#counters").inner_text()[:400])
    print("badges:", page.locator("#tokens span[data-special]").count(), page.eval_on_selector_all("#tokens span[data-special]", "es => es.slice(0,6).map(e => e.className + ' ' + e.innerText)"))
    page.screenshot(path=out, full_page=True)
    b.close()
