"""The API's document against what the code does and what the docs show (issue #11): every route
served is in the OpenAPI document and every operation of it is served; the job spec in
docs/api.md and examples/job.yaml fit the request schema the daemon checks bodies against
(controlplane/frontend/schema.py); the CLI's answer samples fit the document's answer schemas."""

from __future__ import annotations

import re

import jsonschema_rs
import pytest
import yaml

from controlplane.frontend import schema
from controlplane.frontend.app import ROUTES
from controlplane.frontend.openapi import document
from tests.agent.agentproc import REPO
from tests.controlplane.cli import samples

def test_every_route_is_documented_and_every_documented_operation_is_served():
    served = {(m, p) for m, p, _ in ROUTES} | {("GET", "/healthz"), ("GET", "/v1/openapi.json")}
    documented = {(m.upper(), p) for p, ops in document()["paths"].items() for m in ops}
    assert served == documented, (sorted(served - documented), sorted(documented - served))
    for path, ops in document()["paths"].items():
        for op in ops.values():
            declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert declared == set(re.findall(r"{(\w+)}", path)), path


def test_the_docs_list_every_answers_fields_as_the_schema_has_them():
    text = (REPO / "docs" / "api.md").read_text()
    block = re.search(r"<!-- answers: .*? -->\n(.*?)<!-- end of answers -->", text, re.S)
    assert block, "docs/api.md has the answers' fields under ## Answers"
    assert block.group(1) == schema.answers_markdown(), "docs/api.md's answers differ from schema.py: make them again"


def test_the_job_specs_in_the_docs_fit_the_schema_bodies_are_checked_against():
    text = (REPO / "docs" / "api.md").read_text()
    block = re.search(r"## Jobs.*?```yaml\n(.*?)```", text, re.S)
    assert block, "docs/api.md has a job spec under ## Jobs"
    for spec in (yaml.safe_load(block.group(1)), yaml.safe_load((REPO / "examples" / "job.yaml").read_text())):
        assert schema.checked(spec, schema.JobSpec) is spec


def answer_schema(name: str) -> dict:
    doc = document()
    return {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}


@pytest.mark.parametrize("sample, name", [
    (samples.ENTITLEMENT, "Entitlement"), (samples.ENTITLEMENT_DETAIL, "Entitlement"),
    (samples.ENTITLEMENTS, "EntitlementList"), (samples.JOB_RUNNING, "Job"), (samples.JOB_ROLLING, "Job"),
    (samples.JOBS, "JobList"), (samples.MACHINE, "Machine"), (samples.MACHINE_DETAIL, "Machine"),
    (samples.MACHINES, "MachineList"),
    (samples.EVENTS, "EventList"), (samples.DISCOVERY, "Discovery"),
])
def test_the_clis_samples_fit_the_documents_answers(sample, name):
    errors = [f"{e.instance_path}: {e.message}" for e in jsonschema_rs.validator_for(answer_schema(name)).iter_errors(sample)]
    assert not errors, errors


def test_integral_floats_are_integers_but_environment_values_stay_as_given():
    """JSON has one number type: memory_mb 256.0 is the integer 256 (as JSON Schema says). The
    environment's values are the task's strings: 1.0 stays 1.0 there, whatever else the body holds."""
    spec = {"entitlement": "web", "name": "api", "count": 1.0,
            "task": {"image": "twine/busybox:1", "memory_mb": 256.0, "env": {"A": 1.0}, "secret_env": {"B": 2.0}}}
    out = schema.checked(spec, schema.JobSpec)
    assert out["count"] == 1 and isinstance(out["count"], int) and out["task"]["memory_mb"] == 256
    assert isinstance(out["task"]["env"]["A"], float) and isinstance(out["task"]["secret_env"]["B"], float)


def test_bodies_decoded_in_one_pass_take_integral_floats_too():
    """The relay's body is decoded straight into its type (decoded()): a usage figure 5.0, which the
    document allows as an integer, was refused there (schemathesis found it); 5.5 still is, naming
    the field."""
    raw = (b'{"from": "a", "usage": {"cells": [["dc", "msb", "ent", "p", "t", 5.0, 1, 2, 3, 4, 5, 6]]}, "behind": 2}')
    relay = schema.decoded(raw, schema.Relay)
    assert relay.usage.cells[0][5] == 5 and isinstance(relay.usage.cells[0][5], int) and relay.behind == 2.0
    with pytest.raises(schema.ApiError) as e:
        schema.decoded(raw.replace(b"5.0", b"5.5"), schema.Relay)
    assert e.value.status == 400 and e.value.field == "usage.cells[0][5]"


def test_a_body_nested_past_what_the_check_can_follow_is_a_400():
    deep: object = "x"
    for _ in range(3000):
        deep = [deep]
    spec = {"entitlement": "web", "name": "api", "count": 1.0, "task": {"image": "i", "command": deep}}
    with pytest.raises(schema.ApiError) as e:
        schema.checked(spec, schema.JobSpec)
    assert e.value.status == 400
