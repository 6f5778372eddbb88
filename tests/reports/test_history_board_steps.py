"""A step at a revision whose engine code is its predecessor's is the board's (a board step,
with the figure's share of the roofline on both sides), never a commit's; a step where the
code changed is the commit's. Histories built from runs as the store gives them."""

from __future__ import annotations

from reports.history import RevisionRun, history
from reports.steps import StepParams

METRIC = "decode_ms_per_token"


def runs(revision: str, code: str, ms: float, share: float | None, first_id: int
         ) -> list[RevisionRun]:
    """Five runs of one config at ``revision`` (engine code ``code``), ``ms`` each with a
    little spread, with their share of the roofline when judged."""
    shares = ((METRIC, share),) if share is not None else ()
    return [RevisionRun(first_id + i, "nightly", "board-1", "decode ctx=64 exact t=1",
                        revision, f"src-{revision}", {METRIC: ms * (1 + 0.002 * i)}, code,
                        (), shares) for i in range(5)]


def test_a_step_with_the_code_unchanged_is_the_boards_and_one_with_new_code_the_commits(
) -> None:
    order = ["a" * 40, "b" * 40, "c" * 40, "d" * 40]
    found = history([*runs(order[0], "code-1", 10.0, 0.60, 0),
                     *runs(order[1], "code-1", 10.0, 0.60, 10),
                     *runs(order[2], "code-1", 25.0, 0.24, 20),  # same code, 2.5x slower
                     *runs(order[3], "code-2", 50.0, 0.12, 30)],  # new code, 2x slower again
                    order, METRIC, params=StepParams(threshold=0.5))
    assert [(s.revision, round(s.ratio, 2)) for s in found.steps] == [(order[3], 2.0)]
    (board,) = found.board_steps
    assert (board.step.revision, board.previous) == (order[2], order[1])
    assert round(board.step.ratio, 2) == 2.5
    assert (board.share_before, board.share_after) == (0.60, 0.24)
    assert "the board's, not a commit's; share of the roofline 60% -> 24%" in board.line()
    assert found.document()["board_steps"][0]["share_after"] == 0.24
    assert board.line() in found.text()


def test_a_board_step_without_a_judged_share_says_so() -> None:
    order = ["a" * 40, "b" * 40]
    found = history([*runs(order[0], "code-1", 0.03, None, 0),
                     *runs(order[1], "code-1", 0.09, None, 10)],
                    order, METRIC, params=StepParams(threshold=0.5))
    assert found.steps == []
    (board,) = found.board_steps
    assert board.share_before is None and "no share of the roofline judged" in board.line()
