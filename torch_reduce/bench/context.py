"""What every benchmark section gets: options, where results go, the measured line, and a progress bar."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

# The H200's best full fp32 read measured (CUB through CuPy, 2^30 floats; shared/reference): the line
# every GB/s figure is compared against.
MEASURED_LINE_GBPS = 4460.0


def gpu_slug() -> str:
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


@dataclass
class Context:
    quick: bool
    out_dir: Path
    line_gbps: float = MEASURED_LINE_GBPS
    records: dict = field(default_factory=dict)

    def pct_of_line(self, gbps: float) -> float:
        return 100.0 * gbps / self.line_gbps

    def write_json(self, section: str, records: list[dict], section_meta: dict | None = None) -> Path:
        """``section_meta``: the section's own facts (e.g. a baseline's version), added to the common ones."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"{section}.json"
        meta = {
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "line_gbps": self.line_gbps,
            "quick": self.quick,
            **(section_meta or {}),
        }
        path.write_text(json.dumps({"meta": meta, "records": records}, indent=1))
        return path

    def write_text(self, name: str, text: str) -> Path:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / name
        path.write_text(text)
        return path
