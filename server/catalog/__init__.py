"""What exists: the API's resources (``GET /api/v1``) and the suites, workloads, variants
and tensors the fleet has reported (``GET /api/v1/suites``)."""
