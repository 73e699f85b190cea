"""scripts/pass-kernels.py: where a verify pass's time goes, kernel by kernel (on a CPU, the graph path's
rehearsal and its torch ops: the script's structure, not a GPU's figures)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "pass-kernels.py"


def test_busy_time_counts_overlapping_kernels_once_and_kinds_follow_the_names():
    pk = SourceFileLoader("pass_kernels", str(SCRIPT)).load_module()
    assert pk.busy_us([(0, 10), (5, 12), (20, 25)]) == 17
    assert pk.busy_us([]) == 0
    assert pk.kind_of("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64") == "matmul"
    assert pk.kind_of("void gemv2T_kernel_val<int, int, __nv_bfloat16>") == "matmul"
    assert pk.kind_of("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_coopA_TNT") == "matmul"        # cuBLAS on Hopper
    assert pk.kind_of("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>") == "attention"
    assert pk.kind_of("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0") == "fused"
    assert pk.kind_of("Memcpy HtoD (Pinned -> Device)") == "copy"
    assert pk.kind_of("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add>") == "other"


def test_the_script_profiles_each_width_on_the_rehearsal(tiny_paths, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SPECVIZ_CACHE": str(tmp_path / "c")}
    r = subprocess.run([sys.executable, str(SCRIPT), "--target", tiny_paths["target"], "--device", "cpu",
                        "--tokens", "4,1", "--context", "12", "--passes", "3"], capture_output=True, text=True,
                       timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["counted"] == "torch ops" and "no CUDA graphs" in got["path"]
    assert [x["tokens"] for x in got["rows"]] == [1, 4]
    for x in got["rows"]:
        assert x["graphed"] and x["kernels"] > 5 and 0 < x["busy_us"] and x["wall_us"] > 0 and x["synced_us"] > 0
        # the LM head and the layers' projections are matrix multiplies; each layer attends once
        assert x["by_kind"]["matmul"]["n"] >= 2 and x["by_kind"]["attention"]["n"] >= 1
        assert x["top"] and x["bytes"] > 0 and x["mbu"] > 0
    assert "1 token: " in got["summary"] and "torch ops" in r.stderr
    bad = subprocess.run([sys.executable, str(SCRIPT), "--target", tiny_paths["target"], "--tokens", "0,x"],
                         capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert bad.returncode == 2 and "--tokens takes whole numbers 1-1024" in bad.stderr


def test_on_a_gpu_the_kernels_are_the_device_events_and_annotations_are_not_kernels():
    from types import SimpleNamespace as NS

    from torch.autograd import DeviceType

    pk = SourceFileLoader("pass_kernels", str(SCRIPT)).load_module()

    def ev(name, start, end, dev=DeviceType.CUDA, **kw):
        return NS(name=name, device_type=dev, time_range=NS(start=start, end=end), cpu_parent=None, **kw)
    events = [ev("cudaGraphLaunch", 0, 3, DeviceType.CPU), ev("my_pass", 0, 40, is_user_annotation=True),
              ev("gpu range", 0, 40, activity_type="gpu_user_annotation"),
              ev("Memcpy HtoD (Pinned -> Device)", 1, 2), ev("sm90_xmma_gemm_bf16", 2, 12),
              ev("triton_red_fused_rms_norm_0", 12, 14), ev("sm90_xmma_gemm_bf16", 20, 30)]
    kept = pk.device_events(events, cuda=True)
    assert [e.name for e in kept] == ["Memcpy HtoD (Pinned -> Device)", "sm90_xmma_gemm_bf16",
                                      "triton_red_fused_rms_norm_0", "sm90_xmma_gemm_bf16"]
    got = pk.summarise(kept, passes=2)
    assert got["kernels"] == 2 and got["busy_us"] == 11.5
    assert got["by_kind"] == {"copy": {"n": 0.5, "us": 0.5}, "fused": {"n": 0.5, "us": 1.0},
                              "matmul": {"n": 1.0, "us": 10.0}}
    assert got["top"][0] == {"name": "sm90_xmma_gemm_bf16", "n": 1.0, "us": 10.0}
    # one matrix multiply a pass cannot be a whole pass of even a one-layer model (four a layer at least):
    # part of the replayed graph went untraced, and the figures say so; nothing traced says so too
    assert "1 matrix multiplies a pass where the model runs at least 4" in pk.trace_note(got, n_layers=1)
    assert pk.trace_note({**got, "by_kind": {"matmul": {"n": 4.0, "us": 10.0}}}, n_layers=1) is None
    assert "saw nothing" in pk.trace_note(pk.summarise([], passes=2), n_layers=1)
