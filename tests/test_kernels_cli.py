"""`python -m specviz kernels`: the per-shape table of what each product streams on this CPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args, cache):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "SPECVIZ_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "specviz", "kernels", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=ROOT)


def test_kernels_quick_prints_every_product_per_shape_and_row_count(tmp_path):
    import torch

    from specviz.fastpath import layout, rows

    r = _cli("--quick", cache=tmp_path)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout.strip().splitlines()[-1])
    names = set(layout.available(torch.float32))
    assert [(row["shape"], row["rows"]) for row in info["table"]] == [
        (s, n) for s in ("96x64", "64x128") for n in (1, 5, 16)]
    assert all(set(row["GBps"]) == names and row["best"] in names and all(v > 0 for v in row["GBps"].values())
               for row in info["table"])
    assert info["cpu"] and info["threads"] >= 1
    assert info["our_kernel_isa"] == (rows.isa() or None)
    head = r.stdout.splitlines()[0]
    assert info["cpu"] in head and "our kernel" in head and "GB/s" in r.stdout


def test_kernels_bad_rows_is_one_sentence(tmp_path):
    r = _cli("--rows", "0,5", cache=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == ["specviz: error: argument --rows: must be whole numbers from 1 to 64 separated "
                                                "by commas (like 1,64), not '0,5'"]
