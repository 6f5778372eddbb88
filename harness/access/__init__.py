"""Who is acting on a shared farm, and what they may do.

``tokens``: a user's token (made once, stored only as its SHA-256, kept by its user in a file
only they can read) and the shared token a single-operator dashboard may use. ``caller``: the
identity behind a command (``resolve_caller``: the local OS user while the store has no users,
else the user whose token the token file holds) and the rule for acting on someone else's job
or reservation (an admin, saying so: ``Caller.acting_for``).
"""
