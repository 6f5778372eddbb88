"""Running a plan: the coordinator, Ray and placement, the driver loop, board turns and leases,
artifacts by hash, the device side of a run and its driver-side record, progress, reproduce
and the audit's runs (docs/architecture.md draws the path one run travels)."""
