"""Schemathesis against the published OpenAPI document of a running server: no
generated request, valid (positive) or not (negative), may get a 5xx, nor an answer the
document does not describe (its status, content type and body). Kept small (a few examples per
operation) so the whole suite stays within minutes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.generation.case import Case
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from deleatur import Role
from deleatur.servers.http import create_app

from .serving import api_key, new_store, serving

EXAMPLES = 25
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.mark.parametrize("mode", list(GenerationMode))
def test_no_generated_request_gets_a_server_error(tmp_path: Path, mode: GenerationMode) -> None:
    opener = new_store(tmp_path / "mem.db")
    auth = {"Authorization": f"Bearer {api_key(opener, Role.ADMIN)}"}
    with serving(create_app(opener)) as url:
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        operations = []
        for result in schema.get_all_operations():
            assert isinstance(result, Ok), result.err()
            operations.append(result.ok())
        assert len(operations) >= 25
        exercised = []
        for operation in operations:

            @given(case=operation.as_strategy(mode))
            @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
            def no_server_error(case: Case[Any]) -> None:
                case.call_and_validate(headers=auth, checks=CHECKS)

            try:
                no_server_error()
            except Unsatisfiable:
                # An operation whose every input accepts any string has no invalid request.
                assert mode is GenerationMode.NEGATIVE, operation.label
                continue
            exercised.append(operation.label)
        assert len(exercised) >= (len(operations) if mode is GenerationMode.POSITIVE else 15), exercised


def test_every_error_answer_is_documented_as_it_is(tmp_path: Path) -> None:
    """Each error status, provoked for real, is documented for its route, with the body
    it has: ``{"error": {"code", "message"}}``, not FastAPI's ``{"detail": [...]}``.
    So are a purge's 202, and its 200 when nothing is due."""
    opener = new_store(tmp_path / "mem.db")
    admin = {"Authorization": f"Bearer {api_key(opener, Role.ADMIN)}"}
    viewer = {"Authorization": f"Bearer {api_key(opener, Role.VIEWER)}"}
    with serving(create_app(opener, max_body_bytes=4096)) as url:
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        assert "HTTPValidationError" not in schema.raw_schema["components"]["schemas"]
        unknown = "00dc6acf-ac00-7000-8000-000000000000"
        httpx.delete(f"{url}/v1/subjects/Someone", headers={**admin, "Idempotency-Key": "USED-1"})
        httpx.post(f"{url}/v1/memories", headers=admin, json={"text": "to purge", "subject": "s"})
        calls: list[tuple[str, str, str, dict[str, Any], int]] = [
            ("GET", "/v1/memories/{record_id}", f"/v1/memories/{unknown}", {}, 401),
            ("POST", "/v1/memories", "/v1/memories", {"headers": viewer, "json": {"text": "t", "subject": "s"}}, 403),
            ("GET", "/v1/memories/{record_id}", f"/v1/memories/{unknown}", {"headers": admin}, 404),
            ("GET", "/v1/memories/{record_id}", "/v1/memories/nope", {"headers": admin}, 422),
            ("POST", "/v1/memories", "/v1/memories", {"headers": admin, "json": {"text": 1}}, 422),
            # Every route may answer 422, for a query parameter it does not take.
            ("GET", "/v1/whoami", "/v1/whoami", {"headers": admin, "params": {"verbose": "1"}}, 422),
            ("POST", "/v1/memories", "/v1/memories", {"headers": admin, "json": {"text": "t" * 5000}}, 413),
            (
                "DELETE",
                "/v1/subjects/{subject}",
                "/v1/subjects/Another",
                {"headers": {**admin, "Idempotency-Key": "USED-1"}},
                409,
            ),
            (
                "DELETE",
                "/v1/users/{user_id}",
                "/v1/users/u1",
                {"headers": admin, "params": {"require_confirmation": "true"}},
                428,
            ),
            ("POST", "/v1/purge", "/v1/purge", {"headers": admin, "json": {}}, 200),  # nothing due
            ("POST", "/v1/purge", "/v1/purge", {"headers": admin, "json": {"dry_run": True}}, 200),
            ("POST", "/v1/purge", "/v1/purge", {"headers": admin, "json": {"older_than_days": 0}}, 202),
        ]
        for method, template, path, arguments, status in calls:
            response = httpx.request(method, f"{url}{path}", **arguments)
            assert response.status_code == status, (method, path, response.text)
            operation = schema[template][method]
            assert str(status) in operation.definition.raw["responses"], (method, template, status)
            operation.validate_response(response)
            if status >= 400:
                assert set(response.json()) == {"error"}, response.text
