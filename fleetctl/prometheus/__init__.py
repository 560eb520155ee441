"""Prometheus both ways: metric sources an administrator registers (a Prometheus, or an HTTP
endpoint answering JSON), query checks read from them (plan gates, ramp guards), and the
dashboards and alerting rules fleetctl generates for a pool and a plan (docs/prometheus.md)."""
