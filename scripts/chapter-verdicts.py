"""Do the knee's and breadth-vs-depth's verdicts hold from one press to the next? Presses both chapters
`--presses` times on the offline pair (the engine's forward path, as the Lesson tab runs them), each
press in a fresh process as a new page would meet them, and tallies their verdicts with the ratio each
was drawn from and its 95 % interval. `--busy` runs a spinning Python process beside them throughout:
a busy classroom machine, where a verdict should say it cannot tell rather than flip.

    python scripts/chapter-verdicts.py --presses 5 [--busy]

Run it alone on the machine (it times things). Prints one line per press and a JSON tally at the end.
"""
import argparse
import collections
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PRESS = """
import json, time
from specviz.chapters import breadth_depth, knee
from specviz.hardware.device import cached_peaks
from specviz.pairs.pipeline import load_pair
pair = load_pair("smollm2-135m-offline", "ngram")
peaks = cached_peaks(size_mb=128, repeats=3)
t0 = time.perf_counter(); k = list(knee.run_knee(pair, peaks))[-1]; tk = time.perf_counter() - t0
t0 = time.perf_counter(); b = list(breadth_depth.run_breadth_depth(pair))[-1]; tb = time.perf_counter() - t0
v, w = k["values"], b["values"]
print(json.dumps({"knee": k["conclusion"], "ratio2": [v["ratio2"], v["ratio2_lo"], v["ratio2_hi"], v["pairs"]],
                  "knee_s": tk, "bd": b["conclusion"], "bd_n": w["n"],
                  "bd_ratio": [w["ratio"], w["ratio_lo"], w["ratio_hi"], w["pairs"]], "bd_s": tb}))
"""


def press() -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, "-c", PRESS], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"a press failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presses", type=int, default=5)
    ap.add_argument("--busy", action="store_true", help="a spinning Python process beside every press")
    args = ap.parse_args()
    if args.presses < 1:
        ap.error("--presses must be at least 1")
    spin = subprocess.Popen([sys.executable, "-c", "while True: sum(range(100000))"]) if args.busy else None
    tally = collections.Counter()
    try:
        for i in range(args.presses):
            r = press()
            tally["knee " + r["knee"]] += 1
            tally["breadth_depth " + r["bd"]] += 1
            (k, klo, khi, kn), (b, blo, bhi, bn) = r["ratio2"], r["bd_ratio"]
            print(f"press {i + 1}: knee {r['knee']} ratio2 {k:.3f} [{klo:.3f}, {khi:.3f}] {kn} pairs, {r['knee_s']:.1f} s"
                  f" | breadth vs depth {r['bd']} at n = {r['bd_n']}: {b:.3f} [{blo:.3f}, {bhi:.3f}] {bn} pairs,"
                  f" {r['bd_s']:.1f} s", flush=True)
    finally:
        if spin is not None:
            spin.kill()
            spin.wait()
    print(json.dumps({"presses": args.presses, "busy": args.busy, "verdicts": dict(tally)}))


if __name__ == "__main__":
    main()
