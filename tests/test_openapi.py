"""Schemathesis against the published OpenAPI document of a running server: no
generated request, valid (positive) or not (negative), may get a 5xx. Kept small (a few examples per
operation) so the whole suite stays within minutes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.generation.case import Case

from deleatur import Role
from deleatur.servers.http import create_app

from .serving import api_key, new_store, serving

EXAMPLES = 25


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
                case.call_and_validate(headers=auth, checks=[not_a_server_error])

            try:
                no_server_error()
            except Unsatisfiable:
                # An operation whose every input accepts any string has no invalid request.
                assert mode is GenerationMode.NEGATIVE, operation.label
                continue
            exercised.append(operation.label)
        assert len(exercised) >= (len(operations) if mode is GenerationMode.POSITIVE else 15), exercised
