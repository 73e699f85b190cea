"""Record the Runs that ship in assets/recordings/ again, through a running app's API (what the page's
Save run downloads): the default Run (n-gram draft, depth 6) and the same prompt with the expensive
layer-skip draft (depth 4). Each is run `--warm` times first, so the recorded one finds its pair loaded
and warm.

    python scripts/record-runs.py --url http://127.0.0.1:7860 [--out assets/recordings] [--warm 1]

Start the app alone on the machine first (`python app.py`); nothing else should run while it
records, since a replay plays the recorded pace. Prints one JSON line per recording.
"""
import argparse
import json
import os
import shutil
import sys

from gradio_client import Client

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (file stem, a piece of the pair's label, depth)
RUNS = [("cpu-2core-ngram-pays", "n-gram draft", 6),
        ("cpu-2core-layerskip-does-not-pay", "layers 12-17 skipped", 4)]
SAVE, RESULT = 8, 9          # the recording file and the result among /generate's outputs


def pair_labels(client) -> list[str]:
    params = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/generate"]["parameters"]
    return next(p for p in params if p["parameter_name"] == "pair_label")["type"]["enum"]


def run(client, label: str, depth: int) -> tuple:
    """The default Run's settings with this pair and depth (prompt, batch 1, fixed policy, greedy)."""
    return client.predict(pair_label=label, k=depth, batch_size=1, policy_name="fixed", temp=0,
                          api_name="/generate")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:7860")
    ap.add_argument("--out", default=os.path.join(HERE, "assets", "recordings"))
    ap.add_argument("--warm", type=int, default=1, help="unrecorded Runs before each recorded one")
    args = ap.parse_args()
    client = Client(args.url, verbose=False)
    labels = pair_labels(client)
    for stem, piece, depth in RUNS:
        label = next((x for x in labels if piece in x), None)
        if label is None:
            print(f"no pair whose label has {piece!r} on {args.url}", file=sys.stderr)
            return 2
        for _ in range(args.warm):
            run(client, label, depth)
        out = run(client, label, depth)
        dest = os.path.join(args.out, stem + ".json")
        shutil.copyfile(out[SAVE], dest)
        r = out[RESULT]
        print(json.dumps({"file": os.path.relpath(dest, HERE), "pair": label, "depth": depth,
                          "tokens": r["tokens"], "tokens_per_s": round(r["tokens_per_s"], 1),
                          "acceptance": round(r["acceptance_rate"], 3),
                          "speedup_vs_plain": r["speedup_vs_plain"] and round(r["speedup_vs_plain"], 2),
                          "verdict": r["verdict"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
