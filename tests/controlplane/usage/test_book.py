"""A replica's current usage and its sums (controlplane/usage/book.py)."""

from __future__ import annotations

import msgspec

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


def test_each_tasks_own_figures_are_kept_replaced_and_let_go_with_its_machine():
    """Issue #35: beside the sums, each task's last figures where it runs, by job and entitlement."""
    book = UsageBook(stale=5)
    known = {"web/api", "web/db", "batch/etl"}
    book.note("m1", CELL, usage(2.0, 900, [["web/api", 0, 1.5, 300.4], ["web/db", 0, 0.1, 50.0],
                                           ["made/up", 0, 1.0, 1.0]]), known, 0, wall=100.0)
    book.note("m2", CELL, usage(1.0, 200, [["web/api", 1, 0.05, 20.0], ["batch/etl", 0, 0.5, 64.0]]), known, 1,
              wall=101.0)
    rows = lambda ts: sorted(tuple(t) for t in ts)  # noqa: E731
    # (the last field: millicores smoothed over the task's reports there; its first figure at first)
    assert rows(book.tasks(["web/api"])) == [("web/api", 0, "m1", 1500, 300, 100.0, 1500),
                                             ("web/api", 1, "m2", 50, 20, 101.0, 50)]
    assert {t.job for t in book.tasks(entitlements={"web"})} == {"web/api", "web/db"}
    assert {t.job for t in book.tasks(["batch/etl"], {"web"})} == {"web/api", "web/db", "batch/etl"}
    assert len(book.tasks()) == 4 and book.tasks(["made/up"]) == []  # no job of the region's: not kept
    book.note("m1", CELL, usage(1.0, 800, [["web/api", 0, 0.9, 310.0]]), known, 2, wall=102.0)  # web/db gone from m1
    # 1 s of 900 moves the mean of 1500 by 1/30 of the way (1 - e^(-1/30) of it)
    assert rows(book.tasks(entitlements={"web"})) == [("web/api", 0, "m1", 900, 310, 102.0, 1480),
                                                     ("web/api", 1, "m2", 50, 20, 101.0, 50)]
    assert book.sweep(now=6.5) == 1  # m2 silent for 5.5 s
    assert rows(book.tasks()) == [("web/api", 0, "m1", 900, 310, 102.0, 1480)] and list(book.by_job) == ["web/api"]
    book.drop("m1")
    assert book.tasks() == [] and book.by_job == {}


def test_a_tasks_smoothed_figure_follows_its_load_over_half_a_minute_and_starts_again_on_another_machine():
    """What the ReBalancer weighs (cpu_avg_m): a burst of a second or two barely moves it, a load held
    for a minute brings it most of the way; the same task heard from another machine (it moved)
    starts from its figure there."""
    book = UsageBook(stale=100)
    known = {"web/api"}

    def feed(mid: str, cpu: float, seconds: int, t0: int) -> int:
        for t in range(seconds):
            book.note(mid, CELL, usage(cpu, 100, [["web/api", 0, cpu, 10.0]]), known, t0 + t)
        (fig,) = book.tasks(["web/api"])
        return fig.cpu_avg_m

    assert feed("m1", 0.9, 1, 0) == 900
    assert feed("m1", 0.9, 60, 1) == 900
    dipped = feed("m1", 0.3, 2, 61)  # two seconds at a third of it
    assert 860 < dipped < 870, dipped
    assert 360 < feed("m1", 0.3, 60, 63) < 390  # a minute of it: seven eighths of the way down (e^-2)
    book.drop("m1")
    assert feed("m2", 0.7, 1, 200) == 700


def test_a_tasks_smoothed_figure_is_its_own_whatever_the_order_its_agent_lists_them_in():
    book = UsageBook(stale=100)
    known = {"web/api"}
    a, b = ["web/api", 0, 1.0, 10.0], ["web/api", 1, 0.0, 10.0]
    book.note("m1", CELL, usage(1.0, 100, [a, b]), known, 0)
    book.note("m1", CELL, usage(1.0, 100, [["web/api", 2, 0.5, 10.0], b, a]), known, 1)  # a new one first
    figs = {t.index: t.cpu_avg_m for t in book.tasks(["web/api"])}
    assert figs == {0: 1000, 1: 0, 2: 500}, figs
    book.note("m1", CELL, usage(1.0, 100, [["web/api", 0, 0.0, 10.0], ["web/api", 1, 1.0, 10.0]]), known, 2)
    figs = {t.index: t.cpu_avg_m for t in book.tasks(["web/api"])}
    assert figs == {0: 967, 1: 33}, figs  # each moved 1/30 of the way from its own figure


def test_a_tasks_figures_hold_its_jobs_one_string_not_the_reports_copy():
    """Each report's job names are fresh strings (a decoded body); a replica keeps every task's last
    figures, so each held its own copy of its job's handle (issue #38). They hold one string a job."""
    book = UsageBook()
    known = {"web/api"}
    for mid in ("m1", "m2"):
        book.note(mid, CELL, usage(1.0, 100, [["".join(["web/", "api"]), 0, 0.5, 10.0]]), known, 0)
    ((a, *_),), ((b, *_),) = book.machines["m1"].each(), book.machines["m2"].each()
    (job,) = book.by_job
    assert a is b is job and book.machines["m1"].jobs[0] is job
    assert {t.job for t in book.tasks()} == {"web/api"} and all(t.job is job for t in book.tasks())


def test_a_machines_held_figures_take_less_memory_than_its_report_as_decoded():
    """A replica holds every task's last figures, 20 or so a machine (issue #38): packed, a
    machine's held report takes about half what its decoded body does, where a tuple and its numbers a
    task, and a key of its job's map, took 1.8 times it (bench/bench_usage_book.py)."""
    import tracemalloc

    known = {f"web/j{i}" for i in range(4)}

    def report(k: int) -> dict:
        return msgspec.json.decode(msgspec.json.encode(usage(7.25, 40960, [
            [f"web/j{i % 4}", i, 0.31 + i / 100 + k / 1000, 512.0 + i] for i in range(20)])))

    n, book = 500, UsageBook(stale=1e9)
    tracemalloc.start()
    try:
        a = tracemalloc.take_snapshot()
        bodies = [report(k) for k in range(n)]
        b = tracemalloc.take_snapshot()
        for r in range(2):
            for k in range(n):
                book.note(f"m{k}", CELL, report(k + r), known, r)
        c = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    decoded = sum(s.size_diff for s in b.compare_to(a, "filename"))
    held = sum(s.size_diff for s in c.compare_to(b, "filename"))
    assert len(bodies) == n and len(book.tasks()) == 20 * n
    assert held < 0.4 * decoded, (held / n, decoded / n)  # 0.28 here; 0.53 with 64-bit figures and a string a task, 1.77 before


def test_figures_at_the_reports_bounds_are_held_exactly():
    """A task's figures are packed in unsigned 32-bit integers: the largest a report may carry
    (agent/models.py: MAX_HOST_CPUS cores, MAX_HOST_MEMORY_MB, index 1,000,000) are held as they came."""
    from agent.models import MAX_HOST_CPUS, MAX_HOST_MEMORY_MB
    book = UsageBook()
    big = {"window": 1.0, "cpus": MAX_HOST_CPUS, "cpu": float(MAX_HOST_CPUS), "memory_mb": float(MAX_HOST_MEMORY_MB),
           "memory_total_mb": float(MAX_HOST_MEMORY_MB), "power_w": None,
           "tasks": [["web/api", 1_000_000, float(MAX_HOST_CPUS), float(MAX_HOST_MEMORY_MB)],
                     ["web/api", 0, 0.0, 0.0]]}
    book.note("m1", CELL, big, {"web/api"}, 0)
    book.note("m1", CELL, big, {"web/api"}, 1)  # and smoothed against itself
    assert sorted(book.machines["m1"].each()) == [("web/api", 0, 0, 0, 0), (
        "web/api", 1_000_000, MAX_HOST_CPUS * 1000, MAX_HOST_MEMORY_MB, MAX_HOST_CPUS * 1000)]
    assert book.jobs == {"web/api": [MAX_HOST_CPUS * 1000, MAX_HOST_MEMORY_MB, 2]}


def test_machines_of_one_cell_hold_its_one_tuple():
    """The daemon makes a machine's cell anew each heartbeat (cell_of); the book holds one tuple a
    cell, not one a machine (issue #38)."""
    book = UsageBook()
    for mid in ("m1", "m2"):
        book.note(mid, tuple(list(CELL)), usage(1.0, 100, []), set(), 0)
    assert book.machines["m1"].cell is book.machines["m2"].cell and book.machines["m1"].cell == CELL


def test_an_ask_of_many_tasks_pauses_every_step_and_reads_the_book_as_it_is_then():
    """tasks_stepwise yields after each `step` tasks or so (the event loop runs there: RegionUsage),
    answers what tasks() does, and a machine let go at a pause is left out, one reported anew is
    read as it is then (issue #38: every job's tasks in one go held the loop 370 ms at 500,000)."""
    book = UsageBook(stale=100)
    known = {"web/api", "web/db"}
    for k in range(10):
        book.note(f"m{k}", CELL, usage(1.0, 100, [["web/api", 2 * k, 0.5, 10.0], ["web/db", k, 0.25, 5.0]]), known, 0)
    whole = book.tasks()
    steps = book.tasks_stepwise(step=4)
    pauses = 0
    try:
        while True:
            next(steps)
            pauses += 1
    except StopIteration as done:
        assert done.value == whole and len(whole) == 20
    assert pauses == 5  # two tasks a machine: a pause after every second machine

    steps = book.tasks_stepwise(entitlements={"web"}, step=2)
    next(steps)  # m0's two tasks made: a pause
    book.drop("m5")
    book.note("m1", CELL, usage(1.0, 100, [["web/api", 2, 0.9, 10.0]]), known, 1)  # web/db's task gone from m1
    while True:
        try:
            next(steps)
        except StopIteration as done:
            got = done.value
            break
    assert [(t.job, t.index, t.machine) for t in got] == \
        [("web/api", 2 * k, f"m{k}") for k in range(10) if k != 5] + \
        [("web/db", k, f"m{k}") for k in range(10) if k not in (1, 5)]
    assert next(t.cpu_m for t in got if t.machine == "m1") == 900


def test_the_book_keeps_its_machines_in_report_order_and_a_sweep_looks_at_the_stale_ones_only():
    """Issue #38: the sweep (every second, before a partial is sent) passed over every machine the
    book held; the book now holds them in the order their last reports came, so a sweep reads the
    stale ones and the next. Reports out of order (not the daemon's clock) fall back to the pass."""
    looked = []

    class Counted(dict):
        def items(self):
            for mid, h in super().items():
                looked.append(mid)
                yield mid, h

    book = UsageBook(stale=5)
    book.machines = Counted()
    for k in range(1000):
        book.note(f"m{k}", CELL, usage(1.0, 100, []), set(), k / 64)  # m0 at 0 s .. m999 at 15.6 s
    book.note("m0", CELL, usage(1.0, 100, []), set(), 1000 / 64)  # again: the last
    assert list(book.machines)[-2:] == ["m999", "m0"]
    assert book.sweep(10.0) == 319  # m1..m319 came more than 5 s before
    assert len(looked) == 320 and "m320" in book.machines and "m319" not in book.machines and "m0" in book.machines
    looked.clear()
    assert book.sweep(10.5) == 32 and len(looked) == 33
    assert book.cells[CELL][5] == 1000 - 319 - 32

    book.note("late", CELL, usage(1.0, 100, []), set(), 1.0)  # out of order
    looked.clear()
    assert book.sweep(10.5) == 1 and "late" not in book.machines and len(looked) == len(book.machines) + 1
