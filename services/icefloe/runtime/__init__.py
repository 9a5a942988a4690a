"""Plumbing every service shares: Kafka settings, the HTTP health/metrics server, flags."""
