"""Running a job: the coordinator, Ray and placement, the scheduler's queue loop and its fault
handling, board leases, the boards a job may use (the gate) and the announcement of its end,
artifacts by hash, the device side of a run and its driver-side record, progress
(docs/architecture.md draws the path one run travels).

The lab around the jobs (`serve`, health checks, gc) is harness.lab; the back ends of the
audit and of `reproduce` are harness.verify. Both use this package; it uses neither.
"""
