"""Recorded hardware profiles: a measured latency-vs-tokens-per-pass curve with the calibrated peaks and
the model shape it was measured for (written by `python -m specviz roofline`, kept in
`assets/profiles/`). Plain JSON, no torch: the what-if tab reads them as real measurements."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from specviz.roofline import ModelSpec, predicted_knee

PROFILES_DIR = Path(__file__).resolve().parents[1] / "assets" / "profiles"


@dataclass(frozen=True)
class Profile:
    name: str                  # file stem, e.g. "h200-smollm2-1.7b"
    device: str                # hardware.device_name(): "cpu: 2 cores", "cuda: NVIDIA H200", …
    target: str
    context: int
    tokens_per_pass: list[int]
    latency_s: list[float]
    bandwidth: float           # calibrated bytes/s
    flops: float               # calibrated FLOP/s
    measured_knee: float
    spec: ModelSpec | None     # the model shape (for the roofline prediction); None in old files

    @property
    def predicted_knee(self) -> int | None:
        if self.spec is None:
            return None
        return predicted_knee(self.spec, self.bandwidth, self.flops, self.context)

    @property
    def label(self) -> str:
        return f"{self.target} on {self.device} (measured)"


def spec_to_dict(spec: ModelSpec) -> dict:
    return asdict(spec)


def load_profile(path: Path) -> Profile:
    d = json.loads(Path(path).read_text())
    spec = ModelSpec(**d["model_spec"]) if d.get("model_spec") else None
    return Profile(Path(path).stem, d.get("device_name") or d["device"], d["target"], int(d["context"]),
                   [int(n) for n in d["tokens_per_pass"]], [float(t) for t in d["latency_s"]],
                   float(d["bandwidth"]), float(d["flops"]), float(d["measured_knee"]), spec)


def load_profiles(folder: Path = PROFILES_DIR) -> list[Profile]:
    """Every readable profile in `folder`, sorted by name; unreadable files are skipped, not fatal."""
    out = []
    for p in sorted(Path(folder).glob("*.json")):
        try:
            out.append(load_profile(p))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out
