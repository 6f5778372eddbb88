"""Shared test set-up. Fixtures live in one module per area, loaded here as plugins."""

pytest_plugins = [
    "fixtures_engine",
    "fixtures_arch",
    "fixtures_model",
    "fixtures_farm",
    "fixtures_db",
    "fixtures_ray",
    "fixtures_cluster",
    "fixtures_llama",
    "fixtures_notify",
]
