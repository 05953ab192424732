"""Renderers: the rules, the PrometheusRule object and the Grafana dashboards, from one set of settings."""
