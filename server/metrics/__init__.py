"""``GET /metrics`` for Prometheus: the ingest path's counters (per process, summed over
the workers in multiprocess mode) and the fleet's state read from the database."""
