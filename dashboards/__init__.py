"""gpumon's Grafana dashboards as code (grafana-foundation-sdk).

``python -m dashboards`` writes ``dashboards/json/<uid>.json``; the JSON is committed, and
tests/unit/test_dashboards_generated.py fails when regenerating would change it.
"""
