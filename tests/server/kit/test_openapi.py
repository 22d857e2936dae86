"""The OpenAPI schema says what the server does (the whole contract: test_openapi_contract)."""

from __future__ import annotations

from helpers.documents import run_document


def test_every_error_status_has_the_error_body(api):
    schema = api.client.get("/openapi.json").json()
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    runs = schema["paths"]["/api/v1/runs"]
    assert set(runs["post"]["responses"]) >= {"400", "401", "403", "409", "413", "415",
                                               "422", "503"}
    assert set(schema["paths"]["/api/v1/runs/{run_id}"]["get"]["responses"]) >= {
        "401", "403", "404", "422", "503"}
    for operations in schema["paths"].values():
        for operation in operations.values():
            for code, response in operation["responses"].items():
                if int(code) >= 400:
                    assert response["content"]["application/json"]["schema"] == {
                        "$ref": "#/components/schemas/ErrorBody"}
    # And the body a 422 really has is that model.
    answer = api.client.get("/api/v1/runs?limit=0", headers=api.reader).json()
    assert set(answer) == {"error", "detail"} and answer["detail"][0]["loc"] == [
        "query", "limit"]


def test_limits_and_constants_are_in_the_schema(make_api):
    api = make_api(page_max=200)
    schema = api.client.get("/openapi.json").json()
    limit = next(p for p in schema["paths"]["/api/v1/nodes"]["get"]["parameters"]
                 if p["name"] == "limit")
    assert {"type": "integer", "minimum": 1, "maximum": 200} in limit["schema"]["anyOf"]
    assert api.client.get("/api/v1/nodes?limit=201", headers=api.reader).status_code == 422
    pages = {p["name"]: p for p in schema["paths"]["/api/v1/divergence"]["get"]["parameters"]}
    for name in ("pairs_limit", "members_limit"):
        assert [b.get("maximum") for b in pages[name]["schema"]["anyOf"]
                if b["type"] == "integer"] == [200]
    assert pages["pairs"]["schema"]["enum"] == ["baseline", "all"]
    document = schema["components"]["schemas"]["RunDocument"]
    assert document["properties"]["schema"]["enum"] == ["numparity.run/v1"]
    assert schema["components"]["securitySchemes"]["BearerToken"]["scheme"] == "bearer"


def test_a_value_of_another_json_type_is_refused_not_coerced(api):
    document = run_document()
    document["results"][0]["wall_s"] = "0.84"
    answer = api.post_run(document)
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"] == ["body", "results", 0, "wall_s"]
    document = run_document()
    document["started_at"] = 1_700_000_000
    assert api.post_run(document).status_code == 422
    # 3.0 is an integer to JSON.
    document = run_document()
    document["results"][0]["workload_version"] = 1.0
    assert api.post_run(document).status_code == 201


def test_a_405_allows_every_method_of_the_path(api):
    for path, allowed in (("/api/v1/runs", "GET, POST"), ("/login", "GET, POST"),
                          ("/api/v1/nodes", "GET")):
        answer = api.client.delete(path, headers=api.admin)
        assert answer.status_code == 405
        assert answer.headers["allow"] == allowed
