"""The engine's history: git revisions in commit order (``revisions``), measuring a spec at a
revision with the coordinator (``measure``), bisection (``bisect``) and tracking new commits
(``track``). The statistics are in ``reports.steps``, the series in ``reports.history``."""
