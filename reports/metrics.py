"""The metrics a history, bisect or comparison can follow, and the default noise threshold.

Plain names with no imports, so the command line can offer them in `--help` without loading
numpy or pandas (tests/project/test_cli_startup.py).
"""

from __future__ import annotations

# The timings (lower is better for every one) and their units: what `compare` takes.
TIMINGS = {"decode_ms_per_token": "ms per token", "attn_ms_per_token": "ms per token",
           "prefill_ms": "ms", "attn_median_ms": "ms", "engine_ms": "ms"}
# Every metric a history or bisect follows -> its unit ("" for a ratio or a count).
METRICS = {**TIMINGS, "ppl": "", "recall": ""}
HIGHER_IS_BETTER = {"recall"}
# relative change below which a difference is noise (raised to the A/A noise floor)
NOISE_THRESHOLD = 0.05
