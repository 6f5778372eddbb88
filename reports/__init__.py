"""Reports from the result store: experiment reports, comparisons, the audit of claims."""
