"""What every benchmark section gets: options, where results go, the bandwidth line, and a progress bar."""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .timing import gbps, l2_bytes, time_launches

# The H200's best full fp32 read (CUB through CuPy, 2^30 floats, 2026-11-29): a reference figure beside the
# line each run measures, and the line only where none can be measured (no GPU).
REFERENCE_LINE = ("NVIDIA H200", 4460.0)
LINE_LOG2_N = 30  # float32 elements each line measurement moves (2^28 where a 4 GiB copy does not fit)


def gpu_slug() -> str:
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


@dataclass(frozen=True)
class Line:
    """The bandwidth line every GB/s figure is compared against: the best of this GPU's device-to-device
    copy (bytes read + written per second) and full float32 reads (torch.sum, and CUB where CuPy is
    installed; bytes read per second), each over 2^log2_n elements; gbps: the best. Not a ceiling: a kernel
    can pass it. measured is False for the reference figure (no GPU)."""

    gbps: float
    measured: bool
    log2_n: int | None = None
    figures: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        """The line and its figures; the reference figure beside a measured line only on the GPU it belongs to."""
        reference = f"the {REFERENCE_LINE[0]}'s reference: {REFERENCE_LINE[1]:.0f} GB/s"
        if not self.measured:
            return f"Line {self.gbps:.0f} GB/s ({reference}; not measured: no GPU)"
        figures = ", ".join(f"{name} {value:.0f}" for name, value in self.figures.items())
        cited = f" ({reference})" if REFERENCE_LINE[0] in torch.cuda.get_device_name() else ""
        return (f"Line {self.gbps:.0f} GB/s, measured in this run over 2^{self.log2_n} float32: the best of {figures} "
                f"GB/s{cited}")


def measure_line() -> Line:
    """Line of the current GPU, measured now (a few seconds)."""
    from .ladder import cub_sum  # the ladder section imports this module

    log2_n = LINE_LOG2_N if 3 * 4 * 2**LINE_LOG2_N < torch.cuda.mem_get_info()[0] else 28
    n = 2**log2_n
    x = torch.randn(n, device="cuda")
    copy = torch.empty_like(x)
    figures = {"device-to-device copy (read + write)": gbps(2 * 4 * n, time_launches(copy.copy_, [x]).median_ms),
               "torch.sum": gbps(4 * n, time_launches(torch.sum, [x]).median_ms)}
    cub = cub_sum()
    if cub is not None:
        figures["CUB"] = gbps(4 * n, time_launches(cub.fn, cub.prepare([x])).median_ms)
    del x, copy
    torch.cuda.empty_cache()
    return Line(max(figures.values()), True, log2_n, figures)


@dataclass
class Context:
    quick: bool
    out_dir: Path
    records: dict = field(default_factory=dict)
    _line: Line | None = field(default=None, repr=False)

    @property
    def line(self) -> Line:
        """Measured once per run, on first use (the reference figure without a GPU)."""
        if self._line is None:
            self._line = measure_line() if torch.cuda.is_available() else Line(REFERENCE_LINE[1], False)
        return self._line

    @property
    def line_gbps(self) -> float:
        return self.line.gbps

    def pct_of_line(self, gbps: float) -> float:
        return 100.0 * gbps / self.line_gbps

    def write_json(self, section: str, records: list[dict], section_meta: dict | None = None) -> Path:
        """``section_meta``: the section's own facts (e.g. a baseline's version), added to the common ones. The
        line is in the meta once a section has used it."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"{section}.json"
        meta = {
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "l2_bytes": l2_bytes() if torch.cuda.is_available() else None,
            "line_gbps": self._line.gbps if self._line else None,
            "line": asdict(self._line) if self._line else None,
            "reference_line": {"gpu": REFERENCE_LINE[0], "gbps": REFERENCE_LINE[1]},
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
