"""The arguments commands share: their common flags and argument types (no command imports
another)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from reports.metrics import METRICS, NOISE_THRESHOLD

if TYPE_CHECKING:
    from db.measurements import Selection


def device_list(text: str) -> list[str]:
    """--devices: device names or classes, comma-separated."""
    return [item for item in text.split(",") if item]


MAX_ROW_ID = 2**63 - 1  # the store's ids are 64-bit signed integers


def _whole(text: str, low: int, high: int, what: str) -> int:
    """``text`` as a whole number from ``low`` to ``high``, checked before any arithmetic;
    ArgumentTypeError naming the range (exit 2) otherwise."""
    stripped = text.strip()
    digits = stripped[1:] if stripped[:1] in "+-" else stripped
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 40:
        raise argparse.ArgumentTypeError(f"{text[:60]!r} is not {what} (a whole number from "
                                         f"{low} to {high})")
    value = int(stripped)
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{text[:60]!r}: {what} must be from {low} to {high}")
    return value


def job_id(text: str) -> int:
    """A job id: a whole number from 1 to the store's largest id."""
    return _whole(text, 1, MAX_ROW_ID, "a job id")


MAX_PRIORITY = 10**6


def priority(text: str) -> int:
    """--priority: a whole number from -MAX_PRIORITY to MAX_PRIORITY."""
    return _whole(text, -MAX_PRIORITY, MAX_PRIORITY, "a priority")


def job_ref(text: str) -> str:
    """JOB|EXPERIMENT: a job id (checked as ``job_id``) or an experiment name, as given."""
    if text.strip().isascii() and text.strip().isdigit():
        job_id(text)
    return text


def run_count(text: str) -> int:
    """--max-runs: a whole number, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


MAX_PAGE = 10**6  # the most rows one --limit may ask for, and the largest --offset


def page_size(text: str) -> int:
    """--limit: how many rows to show, 0 for all (at most MAX_PAGE)."""
    return _bounded_count(text, 0, MAX_PAGE)


def page_start(text: str) -> int:
    """--offset: how many rows to skip (at most MAX_PAGE)."""
    return _bounded_count(text, 0, MAX_PAGE)


def _bounded_count(text: str, low: int, high: int) -> int:
    value = int(text) if text.strip().isascii() and text.strip().isdigit() else None
    if value is None or not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from {low} to {high}")
    return value


def add_paging(parser: argparse.ArgumentParser, what: str, default: int) -> None:
    """--limit and --offset: a list shown a page at a time."""
    parser.add_argument("--limit", type=page_size, default=default,
                        help=f"show at most this many {what} (default: %(default)s; 0: all)")
    parser.add_argument("--offset", type=page_start, default=0,
                        help=f"skip this many {what} first (the next page)")


def page_note(shown: int, offset: int, total: int, what: str) -> str | None:
    """The line under a page that is not the whole list, or None."""
    if shown >= total and offset == 0:
        return None
    end = offset + shown
    more = f"; --offset {end} for the next" if end < total else ""
    return f"{what} {offset + 1 if shown else offset}-{end} of {total}{more}"


MAX_SECONDS = 86400.0  # a day: the most any duration flag may be (inf or 1e12 never ends)


def positive_seconds(text: str) -> float:
    """--lease-ttl, --poll: a positive number of seconds, at most MAX_SECONDS."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0 and at "
                                         f"most {MAX_SECONDS:g}")
    return value


INVENTORY_HELP = ("inventory TOML (default: $BENCHFARM_INVENTORY, else the local farm's if it "
                  "is up, else only `local`)")


def add_devices(parser: argparse.ArgumentParser, default: str = "the spec's",
                help_text: str | None = None) -> None:
    parser.add_argument("--devices", type=device_list, action="extend", help=help_text or
                        f"device names or classes, comma-separated (default: {default})")


def add_inventory(parser: argparse.ArgumentParser, help_text: str | None = None) -> None:
    parser.add_argument("--inventory", help=help_text or
                        "inventory TOML (default: as for `benchfarm run`)")


def add_ray_address(parser: argparse.ArgumentParser, help_text: str | None = None) -> None:
    parser.add_argument("--ray-address", help=help_text or
                        "join this Ray cluster instead of starting one")


def add_lease_ttl(parser: argparse.ArgumentParser, help_text: str | None = None) -> None:
    parser.add_argument("--lease-ttl", type=positive_seconds,
                        help=help_text or "board lease time in seconds (default: "
                                          "$BENCHFARM_LEASE_TTL_S or 30)")


def add_measuring(parser: argparse.ArgumentParser, metric_help: str) -> None:
    """bisect, track: the metric, the device measured on, the inventory and Ray."""
    parser.add_argument("--metric", default="decode_ms_per_token", choices=list(METRICS),
                        help=f"{metric_help} (default: %(default)s)")
    parser.add_argument("--device", help="the device or class to measure on (default: the "
                                         "spec's first)")
    add_inventory(parser)
    add_ray_address(parser)


def add_threshold(parser: argparse.ArgumentParser, what: str) -> None:
    """history, bisect, track: the relative change below which a difference is noise."""
    parser.add_argument("--threshold", type=float, default=NOISE_THRESHOLD,
                        help=f"{what} (default: %(default)s; a change must also stand beyond "
                             "noise, see reports/steps.py)")
def add_notify(parser: argparse.ArgumentParser, help_text: str, urls_only: bool = False) -> None:
    if urls_only:
        parser.add_argument("--notify", action="append", metavar="URL", help=help_text +
                            " (it gets a JSON POST; repeatable)")
        return
    parser.add_argument("--notify", action="append", metavar="URL|COMMAND", help=help_text +
                        " (an http(s) URL gets a JSON POST; a command, run as you, the JSON on "
                        "stdin; repeatable)")


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_DURATION_S = 10 * 365 * 86400.0  # ten years: --for, --older-than (inf or 1e30s overflowed)


def duration(text: str) -> float:
    """--for, --older-than: a number and a unit (s, m, h, d), e.g. 90m or 2h; seconds, more
    than 0 and at most MAX_DURATION_S (checked before any arithmetic on dates)."""
    number, unit = text[:-1], text[-1:]
    try:
        value = float(number) * DURATION_UNITS[unit]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(
            f"{text[:60]!r} is not a duration; write a number and s, m, h or d, e.g. 90m"
        ) from None
    if not 0 < value <= MAX_DURATION_S:  # nan and inf fail here too
        raise argparse.ArgumentTypeError(f"{text[:60]!r}: a duration must be longer than 0 "
                                         f"and at most {MAX_DURATION_S / 86400:g}d")
    return value


MAX_TEXT_CHARS = 500  # a reason, a note: one line a person writes


def free_text(text: str) -> str:
    """--reason: at most MAX_TEXT_CHARS characters (it is stored and shown to everyone)."""
    if len(text) > MAX_TEXT_CHARS:
        raise argparse.ArgumentTypeError(f"{len(text)} characters; at most {MAX_TEXT_CHARS} "
                                         "characters")
    return text


def utc_moment(text: str) -> datetime:
    """--since, --until: an ISO date or date and time (UTC unless it names its offset)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO date or time, e.g. 2026-12-01 or 2026-12-01T09:30") from None
    return moment if moment.tzinfo is None else moment.astimezone(UTC).replace(tzinfo=None)


def add_measurements(parser: argparse.ArgumentParser) -> None:
    """Which measurements of each run to read (db.measurements.Selection)."""
    parser.add_argument("--all-measurements", action="store_true",
                        help="every measurement of each run (retries, resumes, --force "
                             "reruns; figures use the ok ones), not only its latest ok one")
    parser.add_argument("--since", type=utc_moment,
                        help="only measurements started at or after this UTC date/time")
    parser.add_argument("--until", type=utc_moment,
                        help="only measurements started at or before this UTC date/time")


def selection(args: argparse.Namespace) -> Selection:
    from db.measurements import Selection

    return Selection(args.all_measurements, args.since, args.until)
