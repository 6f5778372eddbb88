"""Step detection side by side: reports.steps against asv, Apache Otava, MongoDB's
signal_processing_algorithms and ruptures' PELT on a seeded synthetic corpus of histories.

    .venv/bin/python bench/steps.py [--quick | --full] [--seed 1] [--lengths 10 30 100 300 1000]
                                    [--only ours otava ...]

Prints one table per history length and a summary. Without ``--quick``/``--full`` it takes a
few minutes on 2 cores (MongoDB's E-Divisive is the slow one at 1000 revisions).

**The corpus** (``make_corpus``; the same for a given seed and size). Per history length
``m`` in 10, 30, 100, 300, 1000: ``max(--per-length, --revisions / m)`` series scored by F1
(``--per-length`` 30, ``--revisions`` 6000: 600 series of 10 revisions, 30 of 1000;
``--quick`` 12 and 1000, ``--full`` 100 and 20000), then flat series enough for
``--flat-revisions`` revisions (10000; ``--quick`` 2000, ``--full`` 40000; at least 4 series)
on which false steps are counted. Every series draws:

* its runs per revision, 1 to 5 (the same at every revision of the series);
* its run noise: log-normal, a standard deviation (of the log) drawn log-uniformly in 1-5 %;
* AR(1) drift between revisions: every revision's runs share a factor ``exp(d_i)``,
  ``d_i = rho d_(i-1) + innovation``, ``rho`` uniform in 0.3-0.8, the drift's own standard
  deviation ``0.25-1.0`` times the run noise (a loaded or warming board);
* outliers: each run, with probability 1 %, 1.3-3x slower (a run disturbed on its own);
* its steps: 0 to ``most_steps(m) = min(20, max(1, m // 8))`` of them (uniformly; none on the
  flat series), at least 4 revisions apart and 2 from either end; each ratio is ``exp(+-r)``
  with ``r`` uniform in ln 1.1 - ln 1.2 for 40 % of them, in ln 1.2 - ln 2 for the rest
  (0.5x-2x, a good share at 1.1x-1.2x).

**The detectors**, each given the same per-revision data: the median of each revision's runs
(the libraries take one value per revision); ours and asv also take the runs' spread (ours
every run; asv a weight per revision, ``1 / standard error``, as asv weighs its points).

* ``ours``: ``reports.steps.detect_steps`` with its default parameters.
* ``asv``: ``asv.step_detect.detect_steps`` (its ``solve_potts_autogamma``) on the medians
  with the weights; a step is every boundary of its segments whose levels differ by more
  than ``detect_regressions``' rule: ``max(error of either segment, 5 % of the level)``
  (asv's default regression threshold), in either direction (the rule raises asv's F1 by
  0.01-0.1 over taking every boundary).
* ``otava``: Apache Otava's ``compute_change_points`` (E-Divisive in sliding windows of 50,
  the t-test merge step, p <= 0.001: Otava's defaults) on the medians.
* ``mongodb``: ``signal_processing_algorithms`` ``e_divisive`` (permutation test p <= 0.05,
  100 permutations: its defaults) on the medians; numpy's global seed set per series.
* ``ruptures-pelt``: ruptures' ``Pelt(model="l2", min_size=2)`` on the log medians, penalty
  ``8 sigma^2 ln m`` (BIC-like, ``sigma`` the noise from one revision to the next, 1.4826
  median |x_i - x_(i-1)| / sqrt 2); of the constants 2, 3, 5, 8, 12, 20 (2 is BIC's, a step
  being two parameters), 8 gave ruptures its best F1 over the lengths on another seed (5).

**The score.** A found step counts when it lies within +-1 revision of a true step (the
index of the first revision at the new level); each true step is matched at most once
(closest pairs first). Per length: precision, recall and F1 pooled over the F1 series (those
that drew no step count with their false steps); apart, the false steps per 100 revisions on
the flat series; and the median seconds per series, wall clock and CPU of this process (the
CPU time is what a shared, loaded machine does not inflate), over all series of the length.

**The libraries** are bench-only (``pip install .[bench]`` lists them); tests never import
them. Two of them pin numpy against each other and against this project (apache-otava 0.8
``numpy==2.2.*``, signal-processing-algorithms 2.1 ``numpy<2`` and ``gevent``, which does not
build here), so they go without their dependencies into a folder of their own (git ignores
it) that this script puts on its path::

    .venv/bin/pip install asv ruptures
    .venv/bin/pip install --no-deps --target .bench-libs apache-otava \\
        signal-processing-algorithms "structlog<25" "more-itertools<9"

Their code runs with this project's numpy and scipy. A library that does not import is left
out of the tables (named on stderr).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if (ROOT / ".bench-libs").is_dir():
    sys.path.append(str(ROOT / ".bench-libs"))

from reports.steps import detect_steps  # noqa: E402

LENGTHS = (10, 30, 100, 300, 1000)
TOLERANCE = 1  # a found step within +-1 revision of a true one counts
MAD_TO_SD = 1.4826

Points = list[list[float]]


@dataclass(frozen=True)
class Case:
    length: int
    points: Points  # the runs' values per revision
    steps: tuple[int, ...]  # the true steps: first revision at each new level
    flat: bool  # one of the flat series the false steps are counted on (not in the F1)
    drawn: dict[str, float]  # runs, noise, rho, drift (sd): what the series drew


def make_case(rng: np.random.Generator, length: int, flat: bool) -> Case:
    """One synthetic history (see the module's text)."""
    runs = int(rng.integers(1, 6))
    noise = math.exp(rng.uniform(math.log(0.01), math.log(0.05)))
    rho = rng.uniform(0.3, 0.8)
    drift_sd = rng.uniform(0.25, 1.0) * noise
    innovation = drift_sd * math.sqrt(1.0 - rho * rho)
    steps: list[int] = []
    wanted = 0 if flat else int(rng.integers(0, most_steps(length) + 1))
    for _ in range(200 * wanted):
        if len(steps) == wanted:
            break
        at = int(rng.integers(2, length - 1))
        if all(abs(at - s) >= 4 for s in steps):
            steps.append(at)
    steps.sort()
    level = np.zeros(length)
    for at in steps:
        size = rng.uniform(math.log(1.1), math.log(1.2)) if rng.random() < 0.4 else \
            rng.uniform(math.log(1.2), math.log(2.0))
        level[at:] += size if rng.random() < 0.5 else -size
    base = math.exp(rng.uniform(0.0, math.log(100.0)))
    drift = rng.normal(0.0, drift_sd)
    points = []
    for i in range(length):
        if i:
            drift = rho * drift + rng.normal(0.0, innovation)
        values = base * np.exp(level[i] + drift + rng.normal(0.0, noise, runs))
        outlying = rng.random(runs) < 0.01
        values[outlying] *= rng.uniform(1.3, 3.0, int(outlying.sum()))
        points.append([float(v) for v in values])
    return Case(length, points, tuple(steps), flat,
                {"runs": runs, "noise": noise, "rho": rho, "drift": drift_sd})


def most_steps(length: int) -> int:
    """The most steps a series of this length draws: 1 at 10 revisions, 20 from 160 on."""
    return max(1, min(20, length // 8))


def make_corpus(seed: int, lengths: Sequence[int], per_length: int, revisions: int,
                flat_revisions: int) -> dict[int, list[Case]]:
    """Per length, ``max(per_length, revisions / length)`` series with 0 .. most_steps steps
    (scored by F1), then the flat series of the false-step count (``Case.flat``)."""
    corpus = {}
    for length in lengths:
        rng = np.random.default_rng([seed, length])
        scored = max(per_length, math.ceil(revisions / length))
        flats = max(4, math.ceil(flat_revisions / length))
        corpus[length] = ([make_case(rng, length, flat=False) for _ in range(scored)]
                          + [make_case(rng, length, flat=True) for _ in range(flats)])
    return corpus


# --- the detectors: each maps a series' points to the indices of its steps ---------------------

def medians(points: Points) -> np.ndarray:
    return np.asarray([float(np.median(v)) for v in points])


def ours(points: Points) -> list[int]:
    return [s.index for s in detect_steps(points)]


def asv_steps(points: Points) -> list[int]:
    from asv.step_detect import detect_steps as asv_detect

    y = medians(points)
    weights: list[float | None] = []
    for values in points:
        sd = MAD_TO_SD * float(np.median(np.abs(np.asarray(values) - np.median(values))))
        weights.append(math.sqrt(len(values)) / sd if len(values) > 1 and sd > 0 else None)
    segments = asv_detect(list(y), weights)
    found = []
    for (_, _, low, _, low_err), (left, _, high, _, high_err) in zip(segments, segments[1:],
                                                                      strict=False):
        if abs(high - low) > max(low_err, high_err, 0.05 * min(abs(low), abs(high))):
            found.append(left)
    return found


def otava_steps(points: Points) -> list[int]:
    from otava.analysis import compute_change_points

    change_points, _ = compute_change_points([float(v) for v in medians(points)],
                                             window_len=50, max_pvalue=0.001)
    return sorted(int(cp.index) for cp in change_points)


def mongodb_steps(points: Points) -> list[int]:
    from signal_processing_algorithms.energy_statistics.energy_statistics import e_divisive

    np.random.seed(len(points))
    return sorted(int(i) for i in e_divisive(medians(points), pvalue=0.05, permutations=100))


def ruptures_steps(points: Points) -> list[int]:
    import ruptures

    x = np.log(medians(points))
    if len(x) < 4:
        return []
    sigma = MAD_TO_SD * float(np.median(np.abs(np.diff(x)))) / math.sqrt(2.0)
    penalty = 8.0 * max(sigma, 1e-6) ** 2 * math.log(len(x))
    ends = ruptures.Pelt(model="l2", min_size=2, jump=1).fit(x).predict(pen=penalty)
    return [int(e) for e in ends[:-1]]


DETECTORS: dict[str, Callable[[Points], list[int]]] = {
    "ours": ours, "asv": asv_steps, "otava": otava_steps, "mongodb": mongodb_steps,
    "ruptures-pelt": ruptures_steps,
}
PROBES = {"asv": "asv.step_detect", "otava": "otava.analysis",
          "mongodb": "signal_processing_algorithms.energy_statistics.energy_statistics",
          "ruptures-pelt": "ruptures"}


def available(names: Sequence[str]) -> list[str]:
    out = []
    for name in names:
        if name in PROBES:
            try:
                __import__(PROBES[name])
            except Exception as exc:  # noqa: BLE001 - any import failure leaves it out
                print(f"{name}: left out ({type(exc).__name__}: {exc})", file=sys.stderr)
                continue
        out.append(name)
    return out


# --- the score --------------------------------------------------------------------------------

def matched(true: Sequence[int], found: Sequence[int], tolerance: int = TOLERANCE) -> int:
    """How many found steps lie within ``tolerance`` of a true step, each matched once
    (closest pairs first)."""
    pairs = sorted((abs(t - f), i, j) for i, t in enumerate(true) for j, f in enumerate(found)
                   if abs(t - f) <= tolerance)
    used_true: set[int] = set()
    used_found: set[int] = set()
    for _, i, j in pairs:
        if i not in used_true and j not in used_found:
            used_true.add(i)
            used_found.add(j)
    return len(used_true)


@dataclass
class Score:
    true: int = 0
    found: int = 0
    hits: int = 0
    flat_false: int = 0
    flat_revisions: int = 0
    wall: list[float] = field(default_factory=list)  # seconds per series
    cpu: list[float] = field(default_factory=list)

    @property
    def precision(self) -> float:
        return self.hits / self.found if self.found else 1.0

    @property
    def recall(self) -> float:
        return self.hits / self.true if self.true else 1.0

    @property
    def f1(self) -> float:
        return 2 * self.hits / (self.true + self.found) if self.true + self.found else 1.0

    @property
    def false_per_100(self) -> float:
        return 100.0 * self.flat_false / self.flat_revisions if self.flat_revisions else 0.0


def score(detector: Callable[[Points], list[int]], cases: Sequence[Case]) -> Score:
    out = Score()
    for case in cases:
        start, cpu = time.perf_counter(), time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = sorted(set(detector(case.points)))
        out.wall.append(time.perf_counter() - start)
        out.cpu.append(time.process_time() - cpu)
        if case.flat:
            out.flat_false += len(found)
            out.flat_revisions += case.length
        else:
            out.true += len(case.steps)
            out.found += len(found)
            out.hits += matched(case.steps, found)
    return out


def table(length: int, cases: Sequence[Case], scores: dict[str, Score]) -> str:
    flat = sum(c.flat for c in cases)
    true = sum(len(c.steps) for c in cases)
    lines = [f"m = {length}: {len(cases) - flat} series with {true} steps in all (F1), "
             f"{flat} flat series ({flat * length} revisions)",
             f"  {'detector':<14} {'F1':>5} {'prec':>5} {'recall':>6} {'false/100 flat':>14} "
             f"{'s/series':>9} {'cpu s':>8}"]
    for name, s in scores.items():
        lines.append(f"  {name:<14} {s.f1:5.2f} {s.precision:5.2f} {s.recall:6.2f} "
                     f"{s.false_per_100:14.3f} {statistics.median(s.wall):9.4f} "
                     f"{statistics.median(s.cpu):8.4f}")
    return "\n".join(lines)


def summary(results: dict[int, dict[str, Score]]) -> str:
    names = list(next(iter(results.values())))
    lengths = list(results)
    head = f"  {'detector':<14}" + "".join(f" {'F1 m=' + str(m):>9}" for m in lengths)
    head += (f" {'false/100 flat':>15} {'worst m':>8} {'s at m=' + str(lengths[-1]):>11}"
             f" {'cpu s':>7}")
    lines = ["summary: F1 per history length (+-1 revision); false steps per 100 revisions on "
             "the flat series, all lengths and the worst length; median seconds per series "
             "at the longest (wall, CPU)", head]
    for name in names:
        cells = "".join(f" {results[m][name].f1:9.2f}" for m in lengths)
        false = sum(results[m][name].flat_false for m in lengths)
        revisions = sum(results[m][name].flat_revisions for m in lengths)
        worst = max(results[m][name].false_per_100 for m in lengths)
        longest = results[lengths[-1]][name]
        lines.append(f"  {name:<14}{cells} {100.0 * false / max(revisions, 1):15.3f} "
                     f"{worst:8.3f} {statistics.median(longest.wall):11.4f} "
                     f"{statistics.median(longest.cpu):7.4f}")
    best = []
    for m in lengths:
        rivals = {n: s.f1 for n, s in results[m].items() if n != "ours"}
        if "ours" in results[m] and rivals:
            top = max(rivals, key=lambda n: rivals[n])
            best.append(f"m={m}: ours {results[m]['ours'].f1:.2f} vs best {top} "
                        f"{rivals[top]:.2f}")
    if best:
        lines.append("  " + "; ".join(best))
    return "\n".join(lines)


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true",
                      help="12 series a length (1000 revisions' worth), 2000 flat revisions")
    size.add_argument("--full", action="store_true",
                      help="100 series a length (20000 revisions' worth), 40000 flat revisions")
    parser.add_argument("--per-length", type=positive, help="the fewest F1 series a length")
    parser.add_argument("--revisions", type=positive,
                        help="the fewest revisions of F1 series a length")
    parser.add_argument("--flat-revisions", type=positive,
                        help="revisions of flat series a length")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--lengths", type=positive, nargs="+", default=list(LENGTHS))
    parser.add_argument("--only", nargs="+", choices=list(DETECTORS), default=list(DETECTORS))
    args = parser.parse_args(argv)
    per_length = args.per_length or (12 if args.quick else 100 if args.full else 30)
    revisions = args.revisions or (1000 if args.quick else 20000 if args.full else 6000)
    flat_revisions = args.flat_revisions or (2000 if args.quick else 40000 if args.full
                                             else 10000)
    names = available(args.only)
    corpus = make_corpus(args.seed, args.lengths, per_length, revisions, flat_revisions)
    print(f"seed {args.seed}; per length >= {per_length} F1 series and >= {revisions} of their "
          f"revisions, >= {flat_revisions} flat revisions; a found step counts within "
          f"+-{TOLERANCE} revision of a true one")
    results: dict[int, dict[str, Score]] = {}
    for length, cases in corpus.items():
        results[length] = {name: score(DETECTORS[name], cases) for name in names}
        print(table(length, cases, results[length]), flush=True)
    print(summary(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
