"""A replica's current usage and its sums (controlplane/usage/book.py)."""

from __future__ import annotations

from controlplane.usage.book import UsageBook

CELL = ("dc1", "msb1", "web", "base", "generic")
POOL = ("dc1", "msb1", "", "", "generic")


def usage(cpu: float, memory: float, tasks: list, power: float | None = None) -> dict:
    return {"window": 1.0, "cpus": 8, "cpu": cpu, "memory_mb": memory, "memory_total_mb": 8192.0, "power_w": power,
            "tasks": tasks}


def test_a_report_replaces_the_machines_last_in_the_sums():
    book = UsageBook(stale=5)
    known = {"web/api", "web/db"}
    book.note("m1", CELL, usage(2.5, 3000, [["web/api", 0, 1.0, 100.0], ["web/db", 0, 0.5, 1000.0]], 95.5), known, 0)
    book.note("m2", CELL, usage(1.0, 500, [["web/api", 1, 0.9994, 120.4]]), known, 0)
    assert book.jobs == {"web/api": [1999, 220, 2], "web/db": [500, 1000, 1]}
    assert book.cells[CELL] == [2499, 1220, 3500, 3500, 95500, 2, 1]
    book.note("m1", CELL, usage(0.3, 2900, [["web/api", 0, 0.2, 110.0]]), known, 1)  # web/db gone from m1
    assert book.jobs == {"web/api": [1199, 230, 2]}
    assert book.cells[CELL] == [1199, 230, 1300, 3400, 0, 2, 0]


def test_a_machine_moved_to_another_cell_leaves_the_old_one():
    book = UsageBook()
    book.note("m1", POOL, usage(0.1, 100, []), set(), 0)
    book.note("m1", CELL, usage(0.2, 200, []), set(), 1)
    assert list(book.cells) == [CELL] and book.cells[CELL][2:6] == [200, 200, 0, 1]


def test_tasks_of_jobs_the_region_does_not_have_are_left_out():
    book = UsageBook()
    book.note("m1", CELL, usage(1.0, 100, [["web/api", 0, 0.5, 10.0], ["made/up", 0, 0.5, 10.0]]), {"web/api"}, 0)
    assert book.jobs == {"web/api": [500, 10, 1]} and book.cells[CELL][:2] == [500, 10]


def test_machines_not_heard_from_are_swept_and_nothing_is_left_behind():
    book = UsageBook(stale=5)
    book.note("m1", CELL, usage(1.0, 100, [["web/api", 0, 0.5, 10.0]]), {"web/api"}, 0)
    book.note("m2", POOL, usage(0.1, 10, []), set(), 4)
    assert book.sweep(6) == 1
    assert book.jobs == {} and list(book.cells) == [POOL] and list(book.machines) == ["m2"]
    book.drop("m2")
    assert book.cells == {} and book.machines == {}
