"""Running a lab: `serve`'s job choice and one job's run (serving), the boards' stored health
checks and their schedule (health), freeing the board and node caches (housekeeping, for
`gc`), a job's story as `logs` and the dashboard tell it (story) and `serve`'s UTC-stamped
output (stamped). It runs jobs through harness.execution; the board gate and the notifications a job
itself needs are there too.
"""
