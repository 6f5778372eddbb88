"""A step that coincides with a change of the board's conditions is the board's, not the
commit's (harness.history.boards.board_change): a condition under most runs of one side and
none of the other names the change; one that a passing load spreads over both sides does not."""

from __future__ import annotations

from typing import Any

from fixtures_reports import healthy_fingerprint

from harness.history.boards import board_change, condition_shares


def loaded() -> dict[str, Any]:
    return healthy_fingerprint() | {"loadavg": [3.5, 2.0, 1.0]}


def test_a_condition_on_one_side_only_is_a_board_change_and_a_passing_one_is_not() -> None:
    quiet = [(healthy_fingerprint(), healthy_fingerprint())] * 4
    busy = [(loaded(), healthy_fingerprint())] * 3 + [(healthy_fingerprint(),) * 2]
    throttled = [(healthy_fingerprint(temp_c=95.0), healthy_fingerprint(temp_c=95.0))] * 4
    assert condition_shares(busy) == {"loaded": 0.75}
    assert condition_shares(throttled) == {"throttling": 1.0}
    before, after = "a" * 40, "b" * 40
    changed = board_change(condition_shares(quiet), condition_shares(busy), before, after)
    assert changed == f"loaded in 75% of the runs at {after[:12]}, none at the other"
    changed = board_change(condition_shares(throttled), condition_shares(quiet), before, after)
    assert changed == f"throttling in 100% of the runs at {before[:12]}, none at the other"
    # a load that came and went over both sides (alternating rounds) changes nothing; nor do
    # conditions the board kept throughout
    passing = [(loaded(), healthy_fingerprint())] + [(healthy_fingerprint(),) * 2] * 3
    assert board_change(condition_shares(passing), condition_shares(busy), before, after) is None
    assert board_change(condition_shares(throttled), condition_shares(throttled), before,
                        after) is None
    assert board_change(condition_shares(quiet), condition_shares(quiet), before, after) is None
    # runs whose engine timed its own CPU leave the load out (cpu_waiting judges it from that)
    assert condition_shares(busy, [True] * 4) == {}
    assert condition_shares(busy, [False, True, True, True]) == {"loaded": 0.25}
    assert condition_shares(throttled, [True] * 4) == {"throttling": 1.0}
