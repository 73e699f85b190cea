"""How the fast path stores the weight matrices it multiplies by, on a CPU.

Decode multiplies a few rows (one per sequence, k + 1 when verifying) by every weight matrix, so the pass
is the time to stream the weights through the matrix kernel. Measured on the 2-core development CPU
(120 layer-shaped fp32 matrices, 425 MB, one row; /tmp micro-benchmarks quoted in the README):
- stock [out, in] layout, `F.linear` → MKL:                 ~17–22 GB/s
- the same matrix stored column-major ([in, out] in memory): ~22–27 GB/s          ("colmajor")
- oneDNN's linear with the weight reordered for it once:    ~50–56 GB/s; 5 rows ~46, 16 rows ~31
  (against ~12 and ~9 for MKL)                                                   ("onednn")
So on a CPU the fast path keeps one copy of each matrix in the best layout this machine runs: oneDNN
where the op exists and agrees with `F.linear` on a probe, else column-major. Copies are shared per
weight (a layer-skip draft and a self-draft reuse the target's) and go when the weight goes; they cost
the weights' size in memory once per model. On CUDA the weights are used in place.

A compiled forward (`torch.compile`) gets the column-major copies: oneDNN's reordered weights are
opaque tensors that the compiler does not trace.
"""
from __future__ import annotations

import threading
import weakref
from functools import lru_cache

import torch
import torch.nn.functional as F

PACK_ROWS = 8          # oneDNN reorders for this many rows: 1–16 rows all ran at their best with it

_COPIES: dict[tuple[int, str], tuple[weakref.ref, torch.Tensor]] = {}   # (id(weight), layout) → copy
_LOCK = threading.Lock()


def _shared(w: torch.Tensor, layout: str, make) -> torch.Tensor:
    key = (id(w), layout)
    with _LOCK:
        ref, copy = _COPIES.get(key, (None, None))
        if ref is not None and ref() is w:
            return copy
        copy = make(w.detach())
        _COPIES[key] = (weakref.ref(w, lambda _, k=key: _COPIES.pop(k, None)), copy)
        return copy


def col_major(w: torch.Tensor) -> torch.Tensor:
    """The same [out, in] matrix stored column-major (values equal; sums may round differently, ~1e-6)."""
    return _shared(w, "colmajor", lambda t: t.t().contiguous().t())


def onednn(w: torch.Tensor) -> torch.Tensor:
    """The matrix reordered once for oneDNN's linear (an opaque tensor only `linear` below can use)."""
    return _shared(w, "onednn", lambda t: torch.ops.mkldnn._reorder_linear_weight(t.contiguous(), PACK_ROWS))


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x @ wᵀ + b for a weight in any of the layouts above."""
    if w.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), w, b, "none", [], "")
    return F.linear(x, w, b)


@lru_cache(maxsize=1)
def _onednn_agrees() -> bool:
    """oneDNN's linear exists here and computes what F.linear does (a probe, not a proof: the fast path's
    warm-up then compares whole greedy generations before the app switches)."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        g = torch.Generator().manual_seed(0)
        w, x, b = (torch.randn(*s, generator=g) for s in ((48, 32), (3, 2, 32), (48,)))
        got = linear(x, torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS), b)
        return got.shape == (3, 2, 48) and torch.allclose(got, F.linear(x, w, b), rtol=1e-4, atol=1e-4)
    except (RuntimeError, AttributeError, TypeError):
        return False


def pick(device: torch.device, dtype: torch.dtype, compiled: bool):
    """The function that stores a weight for the fast path on this device (see the module docstring)."""
    if device.type != "cpu":
        return lambda w: w
    if compiled or dtype != torch.float32:
        return col_major
    return onednn if _onednn_agrees() else col_major
