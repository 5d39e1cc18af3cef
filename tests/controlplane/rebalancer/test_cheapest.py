"""A round with a move budget (controlplane/rebalancer/cheapest.py, plan(max_moves=)): the machines
cheapest to free first across every group, an ejection where a task fits nowhere as things stand,
the budget never passed, and every rule of a compaction move kept (room, memory, racks, the jobs'
churn budgets, the hot share)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from controlplane.rebalancer.board import Board
from controlplane.rebalancer.cheapest import cheapest
from controlplane.rebalancer.plan import plan
from controlplane.rebalancer.view import Group, Machine, Region, Task


def m(mid: str, msb: str = "msb1", cpus: float = 4, mem: int = 4096, rack: str = "r1") -> Machine:
    return Machine(mid, "web", "dc1", msb, int(cpus * 1000), mem, rack=rack)


def t(job: str, i: int, on: str, cpus: float = 1, mem: int = 64, **kw) -> Task:
    return Task(job, i, on, int(cpus * 1000), mem, **kw)


def after(moves, tasks: list[Task]) -> dict[tuple[str, int], str]:
    out = {(x.job, x.index): x.machine for x in tasks}
    out.update({(mv.job, mv.index): mv.target for mv in moves})
    return out


def test_the_machine_with_fewest_tasks_goes_first_across_groups():
    # msb1: a (1 task) and b (3 tasks) can each go onto c, whose own task keeps to its rack (c
    # cannot be freed: a and b are full once one has gone onto the other); msb2: d (2 tasks) onto
    # e, whose own task keeps to its rack (e cannot be freed: d is in another)
    g1 = Group("web", "dc1", "msb1", [m("a"), m("b"), m("c")],
               [t("web/x", 0, "a"), t("web/y", 0, "b"), t("web/y", 1, "b"), t("web/y", 2, "b"),
                t("web/z", 0, "c", keep_rack=True)])
    g2 = Group("web", "dc1", "msb2", [m("d", "msb2"), m("e", "msb2", rack="r2")],
               [t("web/w", 0, "d"), t("web/w", 1, "d"), t("web/v", 0, "e", keep_rack=True)])
    board = Board(Region([g1, g2]), churn=1.0)
    moves, freed = cheapest(board, 3)
    assert freed == {"a", "d"} and len(moves) == 3, "a (1 move), then d (2 moves): b's 3 would pass the budget"
    assert all(mv.goal == "compaction" for mv in moves)
    assert {mv.target for mv in moves} <= {"b", "c", "e"}
    board = Board(Region([g1, g2]), churn=1.0)
    moves, freed = cheapest(board, 100)
    assert len(freed) == 2 and len(moves) in (3, 4), "b and c cannot both go: one of msb1's three is kept"


def test_a_task_that_fits_nowhere_gets_room_by_one_ejection():
    # a's 2-core task fits on neither b nor c (1.5 free each) until c's 1-core task moves to b
    g = Group("web", "dc1", "msb1", [m("a"), m("b"), m("c")],
              [t("web/big", 0, "a", cpus=2), t("web/s", 0, "b", cpus=2.5), t("web/s", 1, "c", cpus=1.5),
               t("web/e", 0, "c", cpus=1)])
    board = Board(Region([g]), churn=1.0)
    moves, freed = cheapest(board, 2)
    assert freed == {"a"} and [(mv.job, mv.source, mv.target) for mv in moves] == \
        [("web/e", "c", "b"), ("web/big", "a", "c")], moves
    assert "makes room on c" in moves[0].why and "frees a" in moves[1].why
    assert cheapest(Board(Region([g]), churn=1.0), 1) == ([], set()), "its two moves pass a budget of 1"


def test_memory_racks_the_jobs_budgets_and_the_hot_share_hold():
    # memory: a's task needs 3 GiB, b has 2 free
    g = Group("web", "dc1", "msb1", [m("a"), m("b")], [t("web/x", 0, "a", mem=3072), t("web/x", 1, "b", mem=2048)])
    assert cheapest(Board(Region([g]), churn=1.0), 10) == ([], set())
    # a rack-spread job's task stays in its rack: b is in another
    g = Group("web", "dc1", "msb1", [m("a", rack="r1"), m("b", rack="r2")],
              [t("web/x", 0, "a", keep_rack=True), t("web/y", 0, "b")])
    assert cheapest(Board(Region([g]), churn=1.0), 10)[1] == {"b"}
    # a job's churn budget (25 % of 4 tasks: 1 move): of its two lone tasks, one moves
    g = Group("web", "dc1", "msb1", [m("a"), m("b"), m("c")],
              [t("web/x", 0, "a"), t("web/x", 1, "b"), t("web/x", 2, "c"), t("web/x", 3, "c")])
    moves, freed = cheapest(Board(Region([g]), churn=0.25), 10)
    assert len(moves) == 1 and len(freed) == 1
    # the hot share: c would use 3.5 of its 4 cores measured (above 80 %)
    g = Group("web", "dc1", "msb1", [m("a"), m("c")], [t("web/x", 0, "a", used=1500), t("web/y", 0, "c", used=2000)])
    assert cheapest(Board(Region([g]), churn=1.0), 10) == ([], set())


def random_region(seed: int) -> Region:
    rnd = random.Random(seed)
    groups, n = [], 0
    for msb in ("msb1", "msb2"):
        ms = [m(f"{msb}-{i}", msb, rack=f"r{i % 3}") for i in range(8)]
        tasks = []
        for mach in ms:
            room, mem_room = 4000, 4096
            for _ in range(rnd.randint(0, 4)):
                c, mem = rnd.choice((500, 1000, 2000)), rnd.choice((256, 1024, 2048))
                if c <= room and mem <= mem_room:
                    room, mem_room = room - c, mem_room - mem
                    job = f"web/j{rnd.randint(0, 5)}"
                    tasks.append(Task(job, n, mach.id, c, mem,
                                      keep_rack=job.endswith("5"), used=rnd.randint(0, c)))
                    n += 1
        groups.append(Group("web", "dc1", msb, ms, tasks))
    return Region(groups)


@pytest.mark.parametrize("seed", range(20))
def test_a_budgeted_plan_keeps_every_rule_and_never_passes_its_budget(seed):
    region = random_region(seed)
    tasks = [x for g in region.groups for x in g.tasks]
    by = {x.id: x for g in region.groups for x in g.machines}
    for budget in (0, 1, 3, 8, 1000):
        p = plan(region, churn=0.5, max_moves=budget)
        assert len(p.moves) <= budget and p.violations == (), (budget, p.violations)
        assert p.to_json()["max_moves"] == budget and p.summary()[0].startswith(f"budget: at most {budget} move(s)")
        where = after(p.moves, tasks)
        assert len({(mv.job, mv.index) for mv in p.moves}) == len(p.moves), "a task moves once a round"
        cap, use, per = Counter(), Counter(), Counter()
        for mach in by.values():
            cap[mach.msb] += mach.cpus
        for x in tasks:
            use[by[where[(x.job, x.index)]].msb] += x.used
            per[(x.job, by[where[(x.job, x.index)]].msb)] += 1
        line = sum(use.values()) / sum(cap.values()) * (1 + p.margin)
        for x in tasks:
            dst, src = by[where[(x.job, x.index)]], by[x.machine]
            assert dst.dc == src.dc
            if dst.msb != src.msb:  # into an MSB left below the hot line, the job's spread kept
                assert use[dst.msb] <= line * cap[dst.msb] + 1e-6
                assert per[(x.job, dst.msb)] <= per[(x.job, src.msb)] + 1
            if x.keep_rack:
                assert dst.rack == src.rack
        for mid, mach in by.items():
            on = [x for x in tasks if where[(x.job, x.index)] == mid]
            assert sum(x.cpus for x in on) <= mach.cpus and sum(x.memory_mb for x in on) <= mach.memory_mb
        freed = {mv.source for mv in p.moves} - set(where.values())
        assert set(p.freed()) >= freed


def two_msbs(x_in_msb2: int = 0, used: int = 0) -> Region:
    # msb1: a holds web/x#0 (1 core), b is full; msb2: c has 2 cores free (less web/x's others), d is full
    g1 = Group("web", "dc1", "msb1", [m("a"), m("b")], [t("web/x", 0, "a", used=used), t("web/f", 0, "b", cpus=4)])
    g2 = Group("web", "dc1", "msb2", [m("c", "msb2"), m("d", "msb2")],
               [t("web/y", 0, "c", cpus=2), t("web/f", 1, "d", cpus=4)]
               + [t("web/x", 1 + i, "c", cpus=0.5) for i in range(x_in_msb2)])
    return Region([g1, g2])


def test_a_task_that_fits_nowhere_in_its_msb_goes_to_another_of_its_dc_that_keeps_its_spread_and_stays_cool():
    moves, freed = cheapest(Board(two_msbs(), churn=1.0), 10)
    assert freed == {"a"} and [(mv.job, mv.source, mv.target, mv.goal) for mv in moves] == \
        [("web/x", "a", "c", "compaction")], moves
    # web/x has as many tasks in msb2 as in msb1: a move there would make its spread worse
    assert cheapest(Board(two_msbs(x_in_msb2=1), churn=1.0), 10) == ([], set())
    # web/x#0 is all the region uses: msb2 would use twice the region's mean, above the hot line
    assert cheapest(Board(two_msbs(used=1000), churn=1.0), 10) == ([], set())


def hot_and_cool(hot: bool) -> Region:
    # msb1: a holds web/x#0, b web/z#0 with 2 cores free; msb2: c and d, 2 cores free each. With
    # `hot`, msb1 uses 0.15 of its cores and msb2 0.075 (the line: the mean 0.1125 x 1.05)
    u = 300 if hot else 0
    g1 = Group("web", "dc1", "msb1", [m("a"), m("b")],
               [t("web/x", 0, "a", used=u), t("web/z", 0, "b", cpus=2, used=3 * u)])
    g2 = Group("web", "dc1", "msb2", [m("c", "msb2"), m("d", "msb2")],
               [t("web/y", 0, "c", cpus=2, used=u), t("web/w", 0, "d", cpus=2, used=u)])
    return Region([g1, g2])


def test_a_drain_out_of_a_hot_msb_goes_to_a_cooler_one_first_and_so_cools_it():
    board = Board(hot_and_cool(hot=True), churn=1.0)
    assert board.load(("dc1", "msb1")) > board.msb_limit
    moves, freed = cheapest(board, 10)
    assert freed == {"a"} and [(mv.source, mv.target) for mv in moves[:1]] == [("a", "c")], moves
    assert board.load(("dc1", "msb1")) <= board.msb_limit, "the drain cooled msb1 to the line"
    # the same region with nothing measured: a's task goes to b, in its own MSB
    moves, freed = cheapest(Board(hot_and_cool(hot=False), churn=1.0), 10)
    assert [(mv.source, mv.target) for mv in moves[:1]] == [("a", "b")], moves


def test_a_budget_too_small_for_the_cooling_goes_to_the_hotspots():
    # msb1 uses 0.31 of its cores, msb2 0.08 (the line: the mean 0.175 x 1.05): web/h#0 (1 core
    # used) cools it, to msb2's g; msb2's e holds one task that fits on f, the cheapest machine
    # to free, but a hot MSB comes first
    g1 = Group("web", "dc1", "msb1", [m("a"), m("b")],
               [t("web/h", 0, "a", used=1000), t("web/s", 0, "a"), t("web/f", 0, "b", cpus=3, used=1500)])
    g2 = Group("web", "dc1", "msb2", [m("e", "msb2"), m("f", "msb2"), m("g", "msb2")],
               [t("web/e", 0, "e"), t("web/f", 1, "f", cpus=2, used=500), t("web/f", 2, "g", cpus=3, used=500)])
    p = plan(Region([g1, g2]), churn=1.0, max_moves=1)
    assert [(mv.job, mv.target, mv.goal) for mv in p.moves] == [("web/h", "g", "hotspots")], p.moves
    assert p.after.hottest_msb < p.before.hottest_msb
    p = plan(Region([g1, g2]), churn=1.0, max_moves=5)
    assert [(mv.job, mv.goal) for mv in p.moves][0] == ("web/h", "hotspots") and "e" in p.freed(), p.moves


def test_a_drains_tasks_go_to_machines_holding_more_tasks_so_the_cheap_ones_stay_cheap():
    # a and b hold a task each; c holds three and has 6.5 cores free. Best fit alone would put a's
    # task on b (2 free), which then holds two (3 cores) and costs 2 moves: with a budget of 2,
    # only a. Onto c, which holds more tasks than a, both a and b are freed with the 2 moves
    g = Group("web", "dc1", "msb1", [m("a"), m("b"), m("c", cpus=8)],
              [t("web/x", 0, "a"), t("web/y", 0, "b", cpus=2)] + [t("web/z", i, "c", cpus=0.5) for i in range(3)])
    moves, freed = cheapest(Board(Region([g]), churn=1.0), 2)
    assert freed == {"a", "b"} and [(mv.source, mv.target) for mv in moves] == [("a", "c"), ("b", "c")], moves


def test_of_machines_as_cheap_a_hot_msbs_goes_first():
    # msb1 uses 0.15 of its cores, msb2 none (the line: the mean 0.075 x 1.05). a (msb1) and c
    # (msb2) hold a task each; c's reserves less, but a's drain to msb2 cools msb1: a goes first
    g1 = Group("web", "dc1", "msb1", [m("a"), m("b")],
               [t("web/x", 0, "a", cpus=2, used=600), t("web/z", 0, "b", cpus=2, used=600)])
    g2 = Group("web", "dc1", "msb2", [m("c", "msb2"), m("d", "msb2")],
               [t("web/y", 0, "c"), t("web/w", 0, "d")])
    board = Board(Region([g1, g2]), churn=1.0)
    assert board.load(("dc1", "msb1")) > board.msb_limit
    moves, freed = cheapest(board, 1)
    assert freed == {"a"} and moves[0].target in ("c", "d"), moves
    assert board.load(("dc1", "msb1")) <= board.msb_limit
