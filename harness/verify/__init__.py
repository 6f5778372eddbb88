"""The back ends of the commands that check results: the audit's runs (claims experiments made
into specs and run, or judged from the store: claims) and its checks that run lmc directly
against a numpy reference (engine_checks), and `reproduce` (a stored run re-run with the
identical binary, model and flags). reports.audit judges; this runs what judging needs.
"""
