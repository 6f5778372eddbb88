"""Planning: a spec and its placements become the cells of a matrix (``matrix``), the named
runs of a plan (``planner``), or an estimate of its time (``estimate``)."""

# The most runs one matrix may have unless --max-runs allows more: planning keeps every run in
# memory and writes its workload rows first, so an accidental 10^7-run spec is refused at once.
# (Here, not in ``matrix``: the command line's parser reads it without importing the planner.)
MAX_RUNS = 20000
