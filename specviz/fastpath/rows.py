"""Our own fp32 kernel for a few rows times a weight matrix on a CPU: the "rows" weight layout.

Why it exists: decode multiplies 1 to ~16 rows (one per sequence, k + 1 when verifying) by every weight
matrix, so a pass should take the time to read the weights once. The library kernels are tuned for
large products; on some CPUs they read a few rows' weights at a fraction of the memory's rate. `rows.c` stores each
matrix as blocks of 16 output columns, K × 16 consecutive floats each, reads every block once from
front to back and keeps up to six rows' sums in registers. Whether it beats the libraries on a given CPU
is measured, like every layout (`specviz.fastpath.layout`); it is one more candidate, not a rule.

Exactness: each output is one running sum over the inputs in order (fp32, fused multiply-add), whatever
the number of rows or threads. So a row multiplied among a verify's 5 or a batch's 80 gets the same bits
as alone, and a speculative pass reproduces decode's logits exactly. Against MKL the sums round
differently (~1e-6), like every other layout; the fast path's warm-up compares whole generations.

The C source is built once per CPU model and compiler with the system's C compiler (`cc`, `-O3
-march=native`, OpenMP: the runtime torch has loaded is the one used, so the threads are torch's) into
the user cache, and checked on a small product before use. No compiler, a failed build or a failed check:
the layout is not offered and the log says why. SPECVIZ_KERNEL=off turns it off.

On a CPU with AVX-512 the 512-bit variant is built (rows.c, SPECVIZ_WIDE: one 64-byte load per block
and step, eight rows' sums in registers, a software prefetch ahead of the stream); SPECVIZ_KERNEL_WIDE=0
builds the 256-bit kernel instead, =1 asks for the wide one. Both give the same bits
(tests/test_fastpath.py checks it where the CPU has AVX-512). The wide variant is level with the 256-bit
one at one row and faster from a few rows on (`kernels` shows both on the CPU at hand). From 12 rows on
(a shared batch's verify, a prefill) the product is bound by arithmetic, not memory: the 512-bit variant
then multiplies two blocks at a time (16 sums in registers for two weight loads), and both variants
fetch the next block while the later row groups work from cache. On every CPU the layout plan times our
product against MKL's and oneDNN's and keeps ours only where it is faster, and the plan's cache key
names the variant (`isa()`) and the source (`source_tag()`).
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specviz.machine import cache_root, cpu_model

log = logging.getLogger("specviz.fastpath")

BLOCK = 16                 # output columns per block: two AVX2 registers (one AVX-512 register)
SOURCE = Path(__file__).with_name("rows.c")
ARCH_FLAGS = (("-march=native",), ("-mcpu=native",), ())   # x86 / ARM spelling, then the compiler's default
BUILD_TIMEOUT_S = 120

_LOCK = threading.Lock()
_STATE: dict[str, object] = {}      # "lib": the loaded library or None; "why": the reason when None


@dataclass(frozen=True, eq=False)
class Packed:
    """A weight [out, in] stored as [ceil(out / 16), in, 16] blocks (zero columns pad the last block)."""

    blocks: torch.Tensor
    out_features: int
    in_features: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)


def pack(w: torch.Tensor) -> Packed:
    """`w` [out, in] in the kernel's block layout (a copy of the same values)."""
    out_f, in_f = w.shape
    padded = -(-out_f // BLOCK) * BLOCK
    src = w.detach().float()
    if padded != out_f:
        src = torch.cat([src, src.new_zeros(padded - out_f, in_f)])
    blocks = src.reshape(padded // BLOCK, BLOCK, in_f).transpose(1, 2).contiguous()
    return Packed(blocks, out_f, in_f)


def multiply(x: torch.Tensor, p: Packed, b: torch.Tensor | None = None) -> torch.Tensor:
    """x @ wᵀ + b for a packed weight: x [..., in] fp32 on the CPU → [..., out]."""
    lib = library()
    if lib is None:              # only reachable if a plan outlived its kernel (tests): same result
        return F.linear(x, unpack(p), b)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, p.in_features)
    if not x2.is_contiguous() or x2.dtype != torch.float32:
        x2 = x2.contiguous().float()
    rows, padded = x2.shape[0], p.blocks.shape[0] * BLOCK
    y = torch.empty(rows, padded, dtype=torch.float32)
    if rows:
        # ctypes lets go of the GIL for the call: other sessions' Python runs meanwhile
        lib.specviz_rows(x2.data_ptr(), rows, p.in_features, p.blocks.data_ptr(), padded, y.data_ptr(),
                         torch.get_num_threads())
    if padded != p.out_features:
        y = y[:, :p.out_features]
    if b is not None:
        y = y + b
    return y.reshape(*lead, p.out_features)


def unpack(p: Packed) -> torch.Tensor:
    """The [out, in] matrix back (tests, and the fallback above)."""
    return p.blocks.transpose(1, 2).reshape(-1, p.in_features)[:p.out_features]


def library():
    """The built kernel (a ctypes library), or None where it cannot be built here (`why()` says why)."""
    if "lib" not in _STATE:
        with _LOCK:
            if "lib" not in _STATE:
                lib, why = _load()
                if why:
                    log.info("fast path: our rows kernel is not available here (%s)", why)
                _STATE.update(lib=lib, why=why)
    return _STATE["lib"]


def wide_wanted() -> bool:
    """The 512-bit variant: SPECVIZ_KERNEL_WIDE=1 / 0 decides; unset, wherever the CPU has AVX-512F."""
    v = os.environ.get("SPECVIZ_KERNEL_WIDE", "").strip().lower()
    if v in ("1", "on", "yes"):
        return True
    if v in ("0", "off", "no"):
        return False
    return _has_avx512()


def _has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return " avx512f" in line
    except OSError:
        pass
    return False


def source_tag() -> str:
    """A short hash of the kernel's source: a layout plan timed with another version of it is stale."""
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:8]


def why() -> str:
    """Why the kernel is not available ("" when it is)."""
    library()
    return str(_STATE.get("why") or "")


def _load():
    if os.environ.get("SPECVIZ_KERNEL", "").strip().lower() in ("off", "0", "no"):
        return None, "SPECVIZ_KERNEL=off"
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not compiler:
        return None, "no C compiler (cc) on this machine"
    try:
        path, err = _built(compiler)
        if path is None:
            return None, err
        lib = ctypes.CDLL(str(path))
        lib.specviz_rows.restype = None
        lib.specviz_rows.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p,
                                     ctypes.c_long, ctypes.c_void_p, ctypes.c_int]
        lib.specviz_layer.restype = None
        lib.specviz_layer.argtypes = ([ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p,
                                       ctypes.POINTER(_Weights)]
                                      + [ctypes.c_void_p] * 5 + [ctypes.c_long] * 5
                                      + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int])
        lib.specviz_layer_scratch.restype = ctypes.c_long
        lib.specviz_layer_scratch.argtypes = [ctypes.c_long, ctypes.POINTER(_Weights)]
        lib.specviz_weights_size.restype = ctypes.c_long
        if lib.specviz_weights_size() != ctypes.sizeof(_Weights):
            return None, (f"its layer struct is {lib.specviz_weights_size()} bytes but the binding's is "
                          f"{ctypes.sizeof(_Weights)}: rows.c and rows.py disagree")
        lib.specviz_isa.restype = ctypes.c_char_p
        lib.specviz_set_gemm.argtypes = [ctypes.c_void_p]
        lib.specviz_has_gemm.restype = ctypes.c_int
        lib.specviz_set_gemm(_blas_sgemm())
    except (OSError, subprocess.SubprocessError, AttributeError) as exc:
        return None, f"could not build or load it: {exc}"
    return (lib, "") if _agrees(lib) else (None, "its self-check disagreed with F.linear")


def _blas_sgemm() -> int | None:
    """The address of the Fortran BLAS `sgemm_` torch itself carries (MKL in torch's x86 wheels), so a C
    layer can run a matrix through the library's product where it is the faster one here (rows.c,
    KIND_STOCK / KIND_COLMAJOR); None where torch links no such symbol (ARM wheels, other BLAS builds)."""
    folder = Path(torch.__file__).parent / "lib"
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib"):
        try:
            lib = ctypes.CDLL(str(folder / name))      # already loaded: this returns the loaded copy
            return ctypes.cast(lib.sgemm_, ctypes.c_void_p).value
        except (OSError, AttributeError):
            continue
    return None


def isa() -> str:
    """The vector code path our kernel was built for here ("avx512", "avx2", "neon", "generic"), or ""."""
    lib = library()
    return lib.specviz_isa().decode() if lib is not None else ""


def has_gemm() -> bool:
    """Whether a C layer can also call the library's product (see `_blas_sgemm`)."""
    lib = library()
    return bool(lib is not None and lib.specviz_has_gemm())


def _built(compiler: str) -> tuple[Path | None, str]:
    """The shared library for this CPU model, compiler and source, built into the user cache if missing."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    source = SOURCE.read_bytes()
    folder = cache_root() / "kernels"
    folder.mkdir(parents=True, exist_ok=True)
    errors = []
    wide = ["-DSPECVIZ_WIDE"] if wide_wanted() else []
    for arch in ARCH_FLAGS:
        flags = ["-O3", *arch, *wide, "-fopenmp", "-shared", "-fPIC", "-std=gnu11", "-lm"]
        tag = hashlib.sha256(repr((source, flags, version, cpu_model())).encode()).hexdigest()[:16]
        path = folder / f"rows-{tag}.so"
        if path.exists():
            return path, ""
        for use in (flags, [f for f in flags if f != "-fopenmp"]):     # clang on macOS: no OpenMP
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
            os.close(fd)
            run = subprocess.run([compiler, *use, str(SOURCE), "-o", tmp], capture_output=True, text=True,
                                 timeout=BUILD_TIMEOUT_S)
            if run.returncode == 0:
                os.replace(tmp, path)           # atomic: a second process never loads half a file
                return path, ""
            os.unlink(tmp)
            errors.append((run.stderr or run.stdout).strip().splitlines()[:1])
    return None, f"{Path(compiler).name} could not build it ({errors[0][0] if errors and errors[0] else '?'})"


def _agrees(lib) -> bool:
    """A small product with a padded block, at 1, 5 and 13 rows, against F.linear."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(37, 40, generator=g)
    p = pack(w)
    for rows in (1, 5, 13):
        x = torch.randn(rows, 40, generator=g)
        y = torch.empty(rows, p.blocks.shape[0] * BLOCK)
        lib.specviz_rows(x.data_ptr(), rows, 40, p.blocks.data_ptr(), y.shape[1], y.data_ptr(), 1)
        if not torch.allclose(y[:, :37], F.linear(x, w), rtol=1e-4, atol=1e-4):
            return False
    return True


# --- whole layers: one call each (rows.c, specviz_layer) ----------------------------------------------
MAX_SLOTS = 32768          # attention scores live on the C stack: 128 KB at most


class _Weights(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in ("ln1", "ln2", "wqkv", "bqkv", "wo", "bo", "wgu", "wdown")]
    _fields_ += [(name, ctypes.c_long) for name in ("d", "H", "Hkv", "hd", "inter", "qkv_w", "o_w", "gu_w",
                                                    "down_w")]
    _fields_ += [("eps", ctypes.c_float), ("kinds", ctypes.c_long * 4)]


KIND_PACKED, KIND_STOCK, KIND_COLMAJOR = 0, 1, 2     # rows.c: how a matrix is stored, whose product runs it


def kind(m) -> int | None:
    """How the C layer multiplies by matrix `m` (a Packed one: our kernel; the model's own [out, in]
    tensor or its column-major copy: the BLAS product), or None when it cannot (oneDNN's opaque tensor,
    another dtype, no BLAS symbol here)."""
    if type(m) is Packed:
        return KIND_PACKED
    if not isinstance(m, torch.Tensor) or m.is_mkldnn or m.dtype != torch.float32 or m.device.type != "cpu":
        return None
    if not has_gemm() or m.dim() != 2:
        return None
    if m.is_contiguous():
        return KIND_STOCK
    if m.stride() == (1, m.shape[0]):
        return KIND_COLMAJOR
    return None


def _c_view(m) -> tuple[int, int, int]:
    """(data pointer, output width as the C layer indexes it, kind) of a matrix `kind` accepted."""
    k = kind(m)
    if k == KIND_PACKED:
        return m.blocks.data_ptr(), m.blocks.shape[0] * BLOCK, k
    return m.data_ptr(), m.shape[0], k


@dataclass(frozen=True, eq=False)
class Layers:
    """Every layer's weights as the C layer reads them (pointers into tensors `keep` holds alive)."""

    weights: tuple
    keep: tuple
    scale: float


def _matrices(w) -> tuple:
    """A layer's four matrices, in the order the C struct holds them: q/k/v, output, gate/up, down."""
    return w.wqkv, w.wo, w.w_gu, w.w_down


def layers(layer_weights, dims, pick) -> Layers | None:
    """The C view of a model's layers (CompactLlama's `LayerWeights`, read by name; `pick(w)` resolves a
    Routed weight for the block's rows), or None when a matrix is in a layout the C layer cannot multiply
    by (`kind`) or a norm or bias is not plain fp32 (the torch layer then serves)."""
    if not layer_weights or any(kind(pick(m)) is None for m in _matrices(layer_weights[0])):
        return None
    if library() is None or dims.n_heads % dims.n_kv or dims.head_dim % 2:
        return None
    out, keep = [], []

    def ptr(t):
        if t is None:
            return None
        if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous():
            raise TypeError
        keep.append(t)
        return t.data_ptr()
    try:
        for w in layer_weights:
            ln1, bqkv, bo, ln2 = w.ln1, w.bqkv, w.bo, w.ln2
            mats = [pick(m) for m in _matrices(w)]
            if any(kind(m) is None for m in mats):
                return None
            keep.extend(mats)
            (q, q_w, _), (o, o_w, _), (gu, gu_w, _), (down, down_w, _) = views = [_c_view(m) for m in mats]
            out.append(_Weights(ptr(ln1), ptr(ln2), q, ptr(bqkv), o, ptr(bo), gu, down, mats[0].shape[1],
                                dims.n_heads, dims.n_kv, dims.head_dim, mats[2].shape[0] // 2,
                                q_w, o_w, gu_w, down_w, dims.eps, (ctypes.c_long * 4)(*(v[2] for v in views))))
    except TypeError:
        return None
    return Layers(tuple(out), tuple(keep), dims.head_dim ** -0.5)


def run_layers(lay: Layers, x, cos, sin, bias, slots, kbufs, vbufs, sel=None) -> torch.Tensor | None:
    """Every layer on a [B, T] block (bias [B, 1, T, S]; its keys/values written at `slots`, consecutive):
    x [B, T, d] and cos, sin [B, T, 1, hd] for the whole block, or, with `sel` (the real tokens' flat
    positions b·T + t), x [N, d] and cos, sin [N, 1, hd] for those only. Returns x after the layers, the
    same shape; None when the block is not one this path takes."""
    B, _, T, S = bias.shape
    d = x.shape[-1]
    k0 = kbufs[0]
    if (S > MAX_SLOTS or k0.dtype != torch.float32 or k0.stride(-1) != 1 or vbufs[0].stride() != k0.stride()
            or slots.numel() != T or (T > 1 and int(slots[-1] - slots[0]) != T - 1)):
        return None
    lib = library()
    shape = x.shape
    x = x.reshape(-1, d).clone(memory_format=torch.contiguous_format)     # updated in place below
    M = x.shape[0]
    cos = cos.reshape(M, -1).contiguous()
    sin = sin.reshape(M, -1).contiguous()
    bias = bias.reshape(B, T, S).contiguous().float()
    if sel is not None:
        sel = sel.to(torch.int64).contiguous()
    scratch = torch.empty(lib.specviz_layer_scratch(M, ctypes.byref(lay.weights[0])))
    threads, slot0 = torch.get_num_threads(), int(slots[0])
    kb, kh, ks = k0.stride(0), k0.stride(1), k0.stride(2)
    for w, kbuf, vbuf in zip(lay.weights, kbufs, vbufs):
        lib.specviz_layer(x.data_ptr(), M, T, None if sel is None else sel.data_ptr(), ctypes.byref(w),
                          cos.data_ptr(), sin.data_ptr(), bias.data_ptr(), kbuf.data_ptr(), vbuf.data_ptr(),
                          kb, kh, ks, S, slot0, lay.scale, scratch.data_ptr(), threads)
    return x.reshape(shape)
