"""Job spec files: YAML and TOML parse to the JSON body of docs/api.md; bad files are named with
the parser's line and reason; unknown top-level keys are refused locally."""

from __future__ import annotations

import pytest

from controlplane.cli.specfile import (
    SPEC_KEYS,
    SpecError,
    parse_spec,
    read_spec,
    spec_handle,
)

YAML_SPEC = """\
entitlement: web
name: frontend
count: 3
task:                      # the agent's task fields
  image: twine/busybox:1
  command: ["sh", "-c", "httpd -f -p 8080"]
  env: {GREETING: hello}
  cpus: 0.5
  memory_mb: 64
requirements: {machine_type: null, dc: null}
preferences: [{property: msb, strategy: spread}]
update: {max_unavailable: 1}
controller: null
"""

TOML_SPEC = """\
entitlement = "web"
name = "frontend"
count = 3
preferences = [{ property = "msb", strategy = "spread" }]

[task]
image = "twine/busybox:1"
command = ["sh", "-c", "httpd -f -p 8080"]
env = { GREETING = "hello" }
cpus = 0.5
memory_mb = 64

[requirements]

[update]
max_unavailable = 1
"""

BODY = {
    "entitlement": "web", "name": "frontend", "count": 3,
    "task": {"image": "twine/busybox:1", "command": ["sh", "-c", "httpd -f -p 8080"], "env": {"GREETING": "hello"},
             "cpus": 0.5, "memory_mb": 64},
    "requirements": {"machine_type": None, "dc": None},
    "preferences": [{"property": "msb", "strategy": "spread"}],
    "update": {"max_unavailable": 1},
    "controller": None,
}


def test_yaml_spec_is_the_api_body():
    assert parse_spec(YAML_SPEC, "job.yaml") == BODY


def test_toml_spec_is_the_api_body():
    # TOML has no null: optional fields are left out (or empty tables) and the daemon defaults them.
    expected = {k: v for k, v in BODY.items() if k != "controller"}
    expected["requirements"] = {}
    assert parse_spec(TOML_SPEC, "job.toml") == expected


def test_read_spec_by_suffix(tmp_path):
    for name, text in [("a.yaml", YAML_SPEC), ("b.yml", YAML_SPEC), ("c.TOML", TOML_SPEC)]:
        (tmp_path / name).write_text(text)
        assert read_spec(tmp_path / name)["task"]["image"] == "twine/busybox:1"


def _why(text: str, name: str) -> str:
    with pytest.raises(SpecError) as e:
        parse_spec(text, name)
    assert str(e.value).startswith(f"{name}: ")
    return e.value.why


def test_bad_yaml_names_the_line_and_reason():
    bad = YAML_SPEC.replace("env: {GREETING: hello}", "env: GREETING: hello")  # line 7
    assert _why(bad, "job.yaml") == "not valid YAML: line 7, column 16: mapping values are not allowed here"
    bad = YAML_SPEC.replace("  cpus: 0.5", "   cpus: 0.5")  # a stray indent on line 8
    assert _why(bad, "job.yaml").startswith("not valid YAML: line 8, column 4: expected <block end>")
    assert _why("entitlement: web\ntask: {image: x\n", "job.yml").startswith("not valid YAML: line 3, column 1: expected ','")


def test_bad_toml_names_the_line_and_reason():
    bad = TOML_SPEC.replace('image = "twine/busybox:1"', "image = twine/busybox:1")  # unquoted, line 7
    assert _why(bad, "job.toml") == "not valid TOML: line 7, column 9: Invalid value"
    assert _why('name = "x"\n[task\n', "job.toml") == "not valid TOML: line 2, column 6: Expected ']' at the end of a table declaration"
    assert "at the end of the file" in _why('name = "x', "job.toml")


def test_duplicate_yaml_key_is_refused_like_toml():
    why = _why(YAML_SPEC + "count: 4\n", "job.yaml")
    assert why == "not valid YAML: line 14, column 1: duplicate key 'count' (first at line 3)"
    assert _why('count = 3\ncount = 4\n', "job.toml") == "not valid TOML: line 2, column 10: Cannot overwrite a value"


def test_unknown_top_level_key_is_named():
    why = _why(YAML_SPEC + "replicas: 3\n", "job.yaml")
    assert why.startswith("unknown key 'replicas'; a job spec has ")
    assert all(k in why for k in SPEC_KEYS)
    assert "did you mean 'entitlement'?" in _why(YAML_SPEC.replace("entitlement:", "entitelment:"), "job.yaml")
    assert _why(TOML_SPEC + "\n[extra]\nx = 1\n", "job.toml").startswith("unknown key 'extra'")


def test_unknown_nested_keys_are_left_to_the_daemon():
    spec = parse_spec(YAML_SPEC.replace("  cpus: 0.5", "  cpus: 0.5\n  gpus: 1"), "job.yaml")
    assert spec["task"]["gpus"] == 1


@pytest.mark.parametrize("text, name, why", [
    ("", "job.yaml", "the file is empty"),
    ("# only a comment\n", "job.yaml", "the file is empty"),
    ("- entitlement: web\n", "job.yaml", "the top level must be a mapping"),
    ("just a string\n", "job.yaml", "the top level must be a mapping"),
    ("entitlement: web\ntask: {when: 2024-01-01}\n", "job.yaml", "task.when: 2024-01-01 is read as a date/time; quote it"),
    ("entitlement = 2024-01-01T00:00:00Z\n", "job.toml", "entitlement: 2024-01-01 00:00:00+00:00 is read as a date/time"),
    ("task: {cpus: .nan}\n", "job.yaml", "task.cpus: nan is not a JSON number"),
    ('{"entitlement": "web"}', "job.json", "a job spec is a .yaml, .yml or .toml file"),
])
def test_other_bad_specs(text, name, why):
    assert why in _why(text, name)


def test_unreadable_file(tmp_path):
    with pytest.raises(SpecError) as e:
        read_spec(tmp_path / "missing.yaml")
    assert str(e.value) == f"{tmp_path / 'missing.yaml'}: cannot read: No such file or directory"
    (tmp_path / "bin.yaml").write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(SpecError, match="not UTF-8"):
        read_spec(tmp_path / "bin.yaml")


def test_spec_handle_for_update():
    assert spec_handle(BODY, "job.yaml") == "web/frontend"
    for bad in ({"name": "frontend"}, {"entitlement": "web", "name": ""}, {"entitlement": "a/b", "name": "c"},
                {"entitlement": "web", "name": 3}):
        with pytest.raises(SpecError, match="must be a name"):
            spec_handle(bad, "job.yaml")
