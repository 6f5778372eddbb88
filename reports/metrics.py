"""The metrics a history, bisect or comparison can follow, and the default noise threshold.

Plain names that import only ``db.records`` (dataclasses, no SQLAlchemy), so the command line
can offer them in `--help` without loading numpy or pandas (tests/project/test_cli_startup.py).
"""

from __future__ import annotations

from db.records import FIGURE_UNITS

# The timings (lower is better for every one) and their units: what `compare` takes. The
# engines' common figures that are timings (db.records.Figures), the per-token ones first,
# then attn-bench's median and the engine process's whole time.
TIMINGS = {**{name: unit for name, unit in sorted(FIGURE_UNITS.items(),
                                                  key=lambda item: item[1] != "ms per token")
              if unit.startswith("ms")},
           "attn_median_ms": "ms", "engine_ms": "ms"}
# Every metric a history or bisect follows -> its unit ("" for a ratio or a count).
METRICS = {**TIMINGS, "ppl": "", "recall": ""}
HIGHER_IS_BETTER = {"recall"}
# relative change below which a difference is noise (raised to the A/A noise floor)
NOISE_THRESHOLD = 0.05
