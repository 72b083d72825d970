"""Prometheus metrics of a gateway process: counters fed in-process, state read at scrape time."""
