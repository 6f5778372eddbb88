"""Running a lab: `serve`'s job choice and one job's run (serving), the boards' stored health
checks and their schedule (health), and freeing the board and node caches (housekeeping, for
`gc`). It runs jobs through harness.execution; the board gate and the notifications a job
itself needs are there too.
"""
