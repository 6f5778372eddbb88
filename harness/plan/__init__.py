"""Planning: a spec and its placements become the cells of a matrix (``matrix``), the named
runs of a plan (``planner``), or an estimate of its time (``estimate``)."""
