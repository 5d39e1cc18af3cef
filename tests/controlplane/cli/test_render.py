"""Readable tables of docs/api.md-shaped JSON (tests/controlplane/cli/samples.py)."""

from __future__ import annotations

from controlplane.cli import render
from tests.controlplane.cli import samples


def columns(text: str, headers) -> list[dict]:
    """Split an aligned table by its header's column offsets; checks every row lines up."""
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith(headers[0] + " "))
    starts = [lines[head].index(h) for h in headers]
    assert starts == sorted(starts)
    rows = []
    for line in lines[head + 1:]:
        cells = [line[a:b].strip() for a, b in zip(starts, starts[1:] + [None])]
        for a in starts[1:]:  # a column starts after a gap: nothing runs over
            assert line[a - 1] == " " and line[a] != " ", (line, a)
        rows.append(dict(zip(headers, cells)))
    return rows


def test_table_aligns_and_fills_gaps():
    text = render.table(("A", "LONGER", "C"), [["x", None, "last col"], ["wide value", 1.5, True], ["", [], ["p", "q"]]])
    assert text.splitlines() == [
        "A           LONGER  C",
        "x           -       last col",
        "wide value  1.5     yes",
        "-           -       p,q",
    ]


def test_job_status_header_and_task_rows():
    text = render.job_status(samples.JOB_ROLLING)
    header, message = text.splitlines()[:2]
    assert header == "job web/frontend  state=active  count=3  spec_version=2  running=2 pending=1"
    assert message == "message: rolling update to spec version 2"
    rows = columns(text, render.TASK_HEADERS)
    assert rows == [
        {"INDEX": "0", "STATE": "running", "MACHINE": "m-001", "DC": "dc1", "MSB": "msb0", "SPEC": "2", "DISCOVERY": "yes", "REASON": "-"},
        {"INDEX": "1", "STATE": "running", "MACHINE": "m-002", "DC": "dc1", "MSB": "msb1", "SPEC": "1", "DISCOVERY": "yes", "REASON": "-"},
        {"INDEX": "2", "STATE": "pending", "MACHINE": "-", "DC": "-", "MSB": "-", "SPEC": "2", "DISCOVERY": "no",
         "REASON": "no machine with 0.5 cpus free in msb2"},
    ]


def test_job_status_orders_tasks_and_handles_a_job_without_tasks():
    job = samples.job([samples.task(2), samples.task(0), samples.task(1)])
    assert [r["INDEX"] for r in columns(render.job_status(job), render.TASK_HEADERS)] == ["0", "1", "2"]
    assert render.job_status(samples.job()) == "job web/frontend  state=active  count=3  spec_version=2  running=0 pending=0"
    assert render.job_status(samples.job([])).endswith("\n(no tasks)")
    odd = dict(samples.job(), summary={"pending": 1, "lost": 2, "running": 0})
    assert "running=0 pending=1 lost=2" in render.job_status(odd)


def test_job_list():
    rows = columns(render.job_list(samples.JOBS), render.JOB_HEADERS)
    assert [(r["HANDLE"], r["STATE"], r["COUNT"], r["SPEC"]) for r in rows] == [
        ("web/frontend", "active", "3", "2"), ("batch-analytics/etl", "stopping", "1", "2")]


def test_machine_list():
    rows = columns(render.machine_list(samples.MACHINES), render.MACHINE_HEADERS)
    assert rows[0] == {"ID": "m-001", "HOSTNAME": "host-001.dc1", "DC": "dc1", "MSB": "msb0", "RACK": "r0",
                       "TYPE": "c2.large", "ENTITLEMENT": "web", "HEALTHY": "yes", "PROFILE": "web", "TASKS": "2",
                       "CPU(used/total)": "1.5/8", "MEM": "128/16384"}
    assert (rows[1]["ENTITLEMENT"], rows[1]["HEALTHY"], rows[1]["PROFILE"], rows[1]["CPU(used/total)"]) == (
        "-", "no", "none->web(failed)", "0/8")


def test_machine_with_missing_fields_still_renders():
    rows = columns(render.machine_list({"machines": [{"id": "m-x"}]}), render.MACHINE_HEADERS)
    assert rows[0]["ID"] == "m-x" and rows[0]["HOSTNAME"] == "-" and rows[0]["MEM"] == "-/-"
    assert render.machine_list({"machines": []}) == "  ".join(render.MACHINE_HEADERS)


def test_machine_show():
    text = render.machine_show(samples.MACHINE_DETAIL)
    assert "labels:         region=eu dc=dc1 msb=msb0 rack=r0 machine_type=c2.large" in text
    assert "cpus:           1.5/8 allocated" in text
    assert "supports:       hugepages" in text
    rows = columns(text, render.MACHINE_TASK_HEADERS)
    assert [(r["JOB"], r["INDEX"], r["STATE"]) for r in rows] == [("web/frontend", "0", "running"), ("web/frontend", "3", "starting")]


def test_entitlement_list_and_show():
    rows = columns(render.entitlement_list(samples.ENTITLEMENTS), render.ENTITLEMENT_HEADERS)
    assert rows == [
        {"NAME": "web", "KIND": "guaranteed", "TYPE": "c2.large", "QUOTA": "10", "HELD": "4", "PROFILE": "web",
         "SPREAD": "dc,msb", "PIN": "-"},
        {"NAME": "batch-analytics", "KIND": "opportunistic", "TYPE": "m5.xlarge", "QUOTA": "200", "HELD": "0",
         "PROFILE": "-", "SPREAD": "msb", "PIN": "dc2"},
    ]
    assert "kind:         opportunistic (machines taken back after 300 s of notice)" in \
        render.entitlement_show(samples.ENTITLEMENTS["entitlements"][1]).splitlines()
    show = render.entitlement_show(samples.ENTITLEMENT_DETAIL).splitlines()
    assert show[0] == "entitlement:  web"
    assert "quota:        4 of 10 machines held" in show
    assert "machines (4): m-001,m-002,m-003,m-004" in show
    assert "jobs (1):     web/frontend" in show
    assert not any(line.startswith("machines") for line in render.entitlement_show(samples.ENTITLEMENT).splitlines())


def test_events_and_discovery():
    rows = columns(render.event_list(samples.EVENTS), render.EVENT_HEADERS)
    assert rows[0]["MACHINES"] == "m-001,m-002,m-003,+2 more" and rows[0]["DURATION"] == "1h30m" and rows[0]["END"] == "-"
    assert rows[1]["START"] == "2024-05-01T08:00:00Z" and rows[1]["DURATION"] == "30s"  # epoch seconds as UTC
    text = render.discovery(samples.DISCOVERY)
    assert text.splitlines()[0] == "job web/frontend"
    assert [(r["INDEX"], r["ENABLED"]) for r in columns(text, render.DISCOVERY_HEADERS)] == [("0", "no"), ("1", "yes")]


def test_durations_and_cells():
    assert [render.duration(v) for v in (0, 59, 60, 3661, 86400 + 7200, "PT5M", None)] == ["0s", "59s", "1m", "1h1m1s", "1d2h", "PT5M", "-"]
    assert render.cell("two\nlines") == "two lines"
    assert render.cell(0) == "0" and render.cell(False) == "no"


def test_job_status_shows_taskcontrol_operations_and_why_they_wait():
    job = {"handle": "web/zk", "state": "active", "count": 2, "spec_version": 2, "summary": {"running": 2},
           "tasks": [],
           "operations": {"held": ["restart #0: update v1 -> v2: waiting for the TaskController"],
                          "waiting": [], "rate_limited": 0},
           "taskcontrol": {"url": "http://127.0.0.1:9090/", "calls": 3, "ok": False,
                           "error": "ClientConnectorError: connection refused",
                           "pending": ["restart/0/v2"], "approved": [], "in_flight": ["restart/1/v2"],
                           "recent_calls": [{"completed": ["restart/2/v2"]}]}}
    text = render.job_status(job)
    assert "taskcontroller: http://127.0.0.1:9090/  calls=3  FAILING: ClientConnectorError" in text
    assert "pending: restart/0/v2" in text and "in flight: restart/1/v2" in text
    assert "recently completed: restart/2/v2" in text
    assert "held: restart #0: update v1 -> v2: waiting for the TaskController" in text


def test_capacity_forecast_shows_the_buffer_the_offer_and_a_buffer_the_pool_cannot_cover():
    from controlplane.cli.capacity import forecast_text

    hour = {"hour": 1_800_003_600, "lead": 1, "expected": 6, "method": "daily", "samples": 120, "p99": 5,
            "p99_measured": True, "p999": 4, "p999_measured": False, "buffer": 3, "offered": 2}
    body = {"history_hours": 200, "offered_level": 0.99, "levels": [0.99, 0.999], "groups": [
        {"group": "generic/dc1", "now": {"machines": 12, "available": 6, "free": 2, "opportunistic": 4,
                                         "reclaiming": 0, "buffer": 3}, "hours": [hour]},
        {"group": "generic/dc2", "now": {"machines": 5, "available": 1, "free": 1, "opportunistic": 0,
                                         "reclaiming": 0, "buffer": 3}, "hours": []}]}
    text = forecast_text(body)
    first = text.split("\n\ngeneric/dc2")[0]
    [row] = columns(first, ("HOUR", "EXPECTED", "99%", "99.9%", "OFFERED", "METHOD", "ERRORS"))
    assert (row["EXPECTED"], row["99%"], row["99.9%"], row["OFFERED"]) == ("6", "5", "4~", "2"), row
    assert "failure-domain buffer: 3 (the guaranteed machines of its largest MSB; lent, not offered)\n" in text, text
    assert "failure-domain buffer: 3 (the guaranteed machines of its largest MSB; lent, not offered); 2 short" in text
