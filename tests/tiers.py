"""The test tiers, one per folder of tests/ and named as the folder (the pytest marker)."""

TIERS = ("unit", "fuzz", "pins", "nvml", "prometheus", "cluster", "e2e", "image")
