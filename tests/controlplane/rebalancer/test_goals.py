"""The goals before compaction (controlplane/rebalancer/goals.py) and the rules every plan keeps
(score.py): repair of uneven spreads, MSB and machine hotspots from measured usage, churn budgets
and cool-downs, and, over 100 rounds on a region whose moves are applied, a plan that converges and
never moves a task back."""

from __future__ import annotations

import dataclasses
import random

from controlplane.rebalancer.plan import plan
from controlplane.rebalancer.view import Group, Machine, Region, Task


def machines(msb: str, n: int, dc: str = "dc1", ent: str = "web", cpus: int = 4000, prefix: str = "") -> list[Machine]:
    name = prefix or msb
    return [Machine(f"{name}-{i}", ent, dc, msb, cpus, 8192, rack=f"{name}-r{i % 2}") for i in range(n)]


def task(job: str, i: int, on: str, cpus: int = 1000, used: int = 0, **kw) -> Task:
    return Task(job, i, on, cpus, 256, used=used, **kw)


def where_after(p, tasks: list[Task]) -> dict[tuple[str, int], str]:
    out = {(t.job, t.index): t.machine for t in tasks}
    out.update({(mv.job, mv.index): mv.target for mv in p.moves})
    return out


def test_a_hot_msb_sends_its_hottest_tasks_to_a_cool_one_of_its_dc():
    a, b, c = machines("msb1", 3), machines("msb2", 2), machines("msb3", 2, dc="dc2")
    # four jobs, each with two hot tasks (0.9 core) in msb1, a cool one in msb2 and one in msb3 (dc2)
    tasks = [task(f"web/j{k}", i, f"msb1-{(2 * k + i) % 3}", used=900) for k in range(4) for i in range(2)]
    tasks += [task(f"web/j{k}", 2, f"msb2-{k % 2}", used=100) for k in range(4)]
    tasks += [task(f"web/j{k}", 3, "msb3-0", used=300) for k in range(4)]
    groups = [Group("web", "dc1", "msb1", a, tasks[:8]), Group("web", "dc1", "msb2", b, tasks[8:12]),
              Group("web", "dc2", "msb3", c, tasks[12:])]
    p = plan(Region(groups), churn=1.0)
    body = p.to_json()
    hot = [mv for mv in body["moves"] if mv["goal"] == "hotspots"]
    # msb2 takes hot tasks while it stays below the mean + 5 %: two of them
    assert len(hot) == 2 and all(mv["source"].startswith("msb1") and mv["target"].startswith("msb2")
                                 for mv in hot), body["moves"]
    assert "MSB msb1 of dc1 uses 1.91x the region's mean" in hot[0]["why"], hot[0]["why"]
    before, after = body["goals"]["hotspots"]["hottest_msb"]["before"], body["goals"]["hotspots"]["hottest_msb"]["after"]
    assert before == 1.909 and after < 1.5, (before, after)
    assert p.violations == ()
    assert all(not mv["target"].startswith("msb3") for mv in body["moves"]), "nothing leaves its dc"
    assert any(line.startswith("hotspots: the hottest MSB uses 1.91x") for line in body["summary"]), body["summary"]
    # each job's spread over dc1's MSBs stays as even as it was (2 and 1, or 1 and 2)
    where = where_after(p, tasks)
    for k in range(4):
        in_msb1 = sum(1 for i in range(3) if where[(f"web/j{k}", i)].startswith("msb1"))
        assert in_msb1 in (1, 2)


def test_a_hot_machine_sheds_tasks_to_a_peer_that_stays_cool():
    ms = machines("msb1", 3)
    tasks = [task("web/a", i, "msb1-0", used=900) for i in range(4)]  # 3.6 of 4 cores measured: 90 %
    tasks += [task("web/b", 0, "msb1-1", cpus=2000, used=2600), task("web/c", 0, "msb1-2", cpus=2000, used=100)]
    p = plan([Group("web", "dc1", "msb1", ms, tasks)], churn=1.0)
    hot = [mv for mv in p.moves if mv.goal == "hotspots"]
    assert [(mv.source, mv.target) for mv in hot] == [("msb1-0", "msb1-2")], p.moves
    assert p.before.hot_machines == 1 and p.after.hot_machines == 0 and p.violations == ()
    assert "msb1-0 uses 90% of its cores (hot above 80%)" in hot[0].why


def test_repair_evens_a_spread_the_allocator_left_uneven_for_want_of_room():
    a, b = machines("msb1", 2), machines("msb2", 2)
    tasks = [task("web/api", i, "msb1-0") for i in range(3)]  # three in msb1, none in msb2
    tasks += [task("web/db", 0, "msb2-0", cpus=3000)]
    p = plan([Group("web", "dc1", "msb1", a, tasks[:3]), Group("web", "dc1", "msb2", b, tasks[3:])], churn=1.0)
    rep = [mv for mv in p.moves if mv.goal == "repair"]
    assert len(rep) == 1 and rep[0].target.startswith("msb2") and rep[0].job == "web/api", p.moves
    assert "web/api had 3 tasks in msb1 and 0 in msb2" in rep[0].why
    assert p.before.spread_excess == 2 and p.after.spread_excess == 0 and p.violations == ()
    # a job that does not spread over MSBs is left where it is
    tasks = [task("web/api", i, "msb1-0", spreads_msb=False) for i in range(3)]
    p = plan([Group("web", "dc1", "msb1", a, tasks), Group("web", "dc1", "msb2", b, [])], churn=1.0)
    assert [mv for mv in p.moves if mv.goal == "repair"] == []


def test_cooling_tasks_stay_and_a_jobs_budget_is_shared_by_the_goals():
    ms = machines("msb1", 4)
    tasks = [task("web/api", i, f"msb1-{i}") for i in range(4)]  # four machines a quarter full
    p = plan([Group("web", "dc1", "msb1", ms, tasks)], churn=0.25)
    assert len(p.moves) == 1, "a quarter of 4 tasks may move a round"
    cooling = {("web/api", i) for i in range(3)}
    p = plan([Group("web", "dc1", "msb1", ms, tasks)], churn=1.0, cooling=cooling)
    assert all((mv.job, mv.index) not in cooling for mv in p.moves) and len(p.moves) == 1, p.moves


def random_region(seed: int) -> Region:
    rnd = random.Random(seed)
    groups, free, racks = [], [], {}
    for dc in ("dc1", "dc2"):
        for k in range(3):
            msb = f"{dc}-msb{k}"
            for ent in ("web", "batch"):
                ms = machines(msb, 6, dc=dc, ent=ent, prefix=f"{ent}-{msb}")
                groups.append(Group(ent, dc, msb, [dataclasses.replace(m, type="generic") for m in ms]))
            free += [Machine(f"free-{msb}-{i}", "", dc, msb, 4000, 8192, rack=f"free-{msb}-r{i % 2}", type="generic")
                     for i in range(rnd.randint(0, 3))]
    for g in groups:
        for m in g.machines:
            racks.setdefault(m.rack, [0, 0])[0] += 1
    for m in free:
        r = racks.setdefault(m.rack, [0, 0])
        r[0] += 1
        r[1] += 1
    for ent in ("web", "batch"):
        mine = [g for g in groups if g.entitlement == ent]
        for j in range(12):
            cpus = rnd.choice((500, 1000, 2000))
            for i in range(rnd.randint(1, 10)):
                g = rnd.choice(mine)
                room = {m.id: m.cpus - sum(t.cpus for t in g.tasks if t.machine == m.id) for m in g.machines}
                fits = [mid for mid, r in room.items() if r >= cpus]
                if fits:
                    used = int(cpus * rnd.uniform(0.05, 0.9))
                    g.tasks.append(task(f"{ent}/j{j}", i, rnd.choice(fits), cpus=cpus, used=used))
    return Region(groups, pool=free, types={"web": "generic", "batch": "generic"},
                  profiles={"web": "web", "batch": None}, racks=racks)


def apply(region: Region, moves, taken: dict[str, str] | None = None) -> Region:
    """The region after a round: the moves applied, the machines swaps took in their entitlement's
    groups, the machines left empty back in the pool (their racks' counts too)."""
    taken = taken or {}
    target = {(mv.job, mv.index): mv.target for mv in moves}
    pool = {m.id: m for m in region.pool}
    out = {(g.entitlement, g.dc, g.msb): Group(g.entitlement, g.dc, g.msb, list(g.machines), [])
           for g in region.groups}
    for mid, ent in taken.items():
        m = dataclasses.replace(pool.pop(mid), entitlement=ent)
        out.setdefault((ent, m.dc, m.msb), Group(ent, m.dc, m.msb, [], [])).machines.append(m)
    racks = {r: list(v) for r, v in region.racks.items()}
    for mid in taken:
        racks[region_rack(region, mid)][1] -= 1
    group_of = {m.id: k for k, g in out.items() for m in g.machines}
    for g in region.groups:
        for t in g.tasks:
            mid = target.get((t.job, t.index), t.machine)
            out[group_of[mid]].tasks.append(Task(t.job, t.index, mid, t.cpus, t.memory_mb, t.keep_rack, t.used,
                                                 t.spreads_msb))
    for g in out.values():
        busy = {t.machine for t in g.tasks}
        for m in [m for m in g.machines if m.id not in busy]:
            g.machines.remove(m)
            pool[m.id] = dataclasses.replace(m, entitlement="")
            racks[m.rack][1] += 1
    return Region([g for g in out.values() if g.machines], region.msb_cpus, list(pool.values()), region.types,
                  region.profiles, racks)


def region_rack(region: Region, mid: str) -> str:
    return next(m.rack for m in region.pool if m.id == mid)


def test_a_hundred_rounds_on_a_stable_region_converge_and_never_move_a_task_back():
    region = random_region(27)
    left: dict[tuple[str, int], set[str]] = {}  # machines each task moved away from
    per_round, cooling_rounds, history, swapped = [], 3, [], 0
    for rnd in range(100):
        cooling = {k for moved in history[-cooling_rounds:] for k in moved}
        p = plan(region, churn=0.25, cooling=cooling)
        assert p.violations == (), (rnd, p.violations)
        for mv in p.moves:
            assert mv.target not in left.get((mv.job, mv.index), set()), f"round {rnd}: {mv} moves it back"
            left.setdefault((mv.job, mv.index), set()).add(mv.source)
        per_round.append(len(p.moves))
        history.append({(mv.job, mv.index) for mv in p.moves})
        swapped += len(p.taken)
        region = apply(region, p.moves, p.taken)
    assert per_round[0] > 0, "the random region has something to improve"
    assert swapped > 0, "swaps with the free pool took part"
    settled = next(i for i in range(100) if not any(per_round[i:]))
    assert settled <= 10, per_round[:20]


def pool(msb: str, n: int, rack: str, dc: str = "dc1", prefix: str = "") -> list[Machine]:
    return [Machine(f"{prefix or msb}-p{i}", "", dc, msb, 4000, 8192, rack=rack, type="generic") for i in range(n)]


def test_a_swap_with_the_free_pool_evens_a_spread_the_entitlement_had_no_room_for():
    w1 = Machine("w1", "web", "dc1", "msb1", 4000, 8192, rack="r1", type="generic")
    w2 = Machine("w2", "web", "dc1", "msb1", 4000, 8192, rack="r1", type="generic")
    w3 = Machine("w3", "web", "dc1", "msb2", 4000, 8192, rack="r2", type="generic")
    tasks1 = [task("web/api", 0, "w1", cpus=2500), task("web/api", 1, "w2", cpus=2500),
              task("web/fill", 0, "w2", cpus=1000)]
    tasks2 = [task("web/db", 0, "w3", cpus=4000)]  # msb2: web's machine there is full
    free = pool("msb2", 1, "r3")
    region = Region([Group("web", "dc1", "msb1", [w1, w2], tasks1), Group("web", "dc1", "msb2", [w3], tasks2)],
                    pool=free, types={"web": "generic"}, profiles={"web": "web"},
                    racks={"r1": [2, 0], "r2": [1, 0], "r3": [2, 1]})  # r3: not wholly free before
    p = plan(region, churn=1.0)
    assert [(mv.job, mv.index, mv.source, mv.target, mv.goal) for mv in p.moves] == \
        [("web/api", 0, "w1", "msb2-p0", "swaps")], p.moves
    assert p.taken == {"msb2-p0": "web"} and p.freed() == ["w1"] and p.violations == ()
    assert p.before.spread_excess == 1 and p.after.spread_excess == 0
    body = p.to_json()
    assert body["taken"] == {"msb2-p0": "web"} and body["goals"]["swaps"]["machines_swapped"]["after"] == 1
    assert "goes back to the free pool and web takes msb2-p0" in p.moves[0].why
    assert any(line.startswith("swaps: 1 machine(s) exchanged with the free pool") for line in body["summary"])
    # a pool machine of another type, or in another dc, is never taken
    for other in (Machine("x", "", "dc1", "msb2", 4000, 8192, rack="r3", type="big"),
                  Machine("x", "", "dc2", "msb2", 4000, 8192, rack="r3", type="generic")):
        region.pool = [other]
        assert plan(region, churn=1.0).taken == {}


def test_a_swap_frees_a_whole_rack_and_never_makes_a_spread_worse():
    w1 = Machine("w1", "web", "dc1", "msb1", 4000, 8192, rack="r1", type="generic")
    w4 = Machine("w4", "web", "dc1", "msb1", 4000, 8192, rack="r2", type="generic")
    tasks = [task("web/api", 0, "w1", cpus=2500), task("web/db", 0, "w4", cpus=2500)]
    free = [Machine("p1", "", "dc1", "msb1", 4000, 8192, rack="r1", type="generic"),
            Machine("p2", "", "dc1", "msb1", 4000, 8192, rack="r2", type="generic")]
    region = Region([Group("web", "dc1", "msb1", [w1, w4], tasks)], pool=free, types={"web": "generic"},
                    profiles={"web": None}, racks={"r1": [2, 1], "r2": [2, 1]})
    p = plan(region, churn=1.0)
    (mv,) = p.moves
    # either machine's move frees its rack; the other's free machine is in a rack that is not
    assert mv.goal == "swaps" and p.racks_free == (0, 1) and "wholly free" in mv.why, p.moves
    assert p.violations == ()
    # nothing to gain (each rack has a held machine that stays): no swap
    region.racks = {"r1": [3, 1], "r2": [3, 1]}
    assert plan(region, churn=1.0).moves == ()


def test_a_swap_that_evens_one_job_never_makes_another_jobs_spread_worse():
    # api: 3 tasks in msb1, none in msb2 (full); db: one in each. Swapping w1 (api#0, api#1, db#0)
    # for a free machine of msb2 evens api (excess 2 -> 0) but puts both of db's tasks in msb2 (0 -> 1)
    w1 = Machine("w1", "web", "dc1", "msb1", 4000, 8192, rack="r1", type="generic")
    w2 = Machine("w2", "web", "dc1", "msb1", 4000, 8192, rack="r1", type="generic")
    w3 = Machine("w3", "web", "dc1", "msb2", 4000, 8192, rack="r2", type="generic")
    tasks1 = [task("web/api", 0, "w1"), task("web/api", 1, "w1"), task("web/db", 0, "w1"),
              task("web/api", 2, "w2"), task("web/fill", 0, "w2", cpus=3000)]
    tasks2 = [task("web/db", 1, "w3"), task("web/fill", 1, "w3", cpus=3000)]
    region = Region([Group("web", "dc1", "msb1", [w1, w2], tasks1), Group("web", "dc1", "msb2", [w3], tasks2)],
                    pool=pool("msb2", 1, "r3"), types={"web": "generic"}, profiles={"web": "web"},
                    racks={"r1": [2, 0], "r2": [1, 0], "r3": [2, 1]})
    p = plan(region, churn=1.0)
    assert p.violations == (), p.violations
    # (w2's swap would even api and break fill's spread the same way): msb1's machines stay; the swap
    # that frees w3's rack, within msb2, changes no spread and may be made
    assert all(mv.source == "w3" for mv in p.moves), p.moves
    assert p.after.spread_excess <= p.before.spread_excess


def test_a_swap_that_frees_a_rack_never_moves_a_spread_job_to_an_msb_where_it_has_more():
    # w1 is the only machine of rack r1: swapping it for msb2's free machine would free the rack,
    # and leave api with both of its tasks in msb2 (excess 0 -> 1): no swap; the rack stays
    w1 = Machine("w1", "web", "dc1", "msb1", 4000, 8192, rack="r1", type="generic")
    w2 = Machine("w2", "web", "dc1", "msb2", 4000, 8192, rack="r2", type="generic")
    tasks1, tasks2 = [task("web/api", 0, "w1")], [task("web/api", 1, "w2", cpus=3000)]
    region = Region([Group("web", "dc1", "msb1", [w1], tasks1), Group("web", "dc1", "msb2", [w2], tasks2)],
                    pool=pool("msb2", 1, "r3"), types={"web": "generic"}, profiles={"web": None},
                    racks={"r1": [1, 0], "r2": [2, 0], "r3": [2, 1]})  # (r2's other machine: another's)
    p = plan(region, churn=1.0)
    assert p.moves == () and p.taken == {} and p.violations == (), p.moves
    # a job without a spread over MSBs may go: the rack is freed
    region.groups[0].tasks[0] = task("web/api", 0, "w1", spreads_msb=False)
    region.groups[1].tasks[0] = task("web/api", 1, "w2", cpus=3000, spreads_msb=False)
    p = plan(region, churn=1.0)
    assert [(mv.source, mv.target, mv.goal) for mv in p.moves] == [("w1", "msb2-p0", "swaps")], p.moves
    assert p.racks_free == (0, 1) and p.violations == ()


def test_a_swap_never_takes_a_machine_in_an_msb_new_to_the_entitlement():
    # web holds msb1 and msb2 of dc1; db has two tasks in each (excess 0). Freeing rack r1 by
    # swapping w1 (api's one task) for msb3's free machine would make msb3 one of web's MSBs, where
    # db has none: db's spread counts it (excess 0 -> 1), though no task of db moves
    w1 = Machine("w1", "web", "dc1", "msb1", 4000, 8192, rack="r1", type="generic")
    w4 = Machine("w4", "web", "dc1", "msb1", 4000, 8192, rack="r4", type="generic")
    w2 = Machine("w2", "web", "dc1", "msb2", 4000, 8192, rack="r2", type="generic")
    tasks1 = [task("web/api", 0, "w1"), task("web/db", 0, "w4", cpus=2000), task("web/db", 1, "w4", cpus=2000)]
    tasks2 = [task("web/db", 2, "w2", cpus=2000), task("web/db", 3, "w2", cpus=2000)]
    region = Region([Group("web", "dc1", "msb1", [w1, w4], tasks1), Group("web", "dc1", "msb2", [w2], tasks2)],
                    pool=pool("msb3", 1, "r3"), types={"web": "generic"}, profiles={"web": None},
                    racks={"r1": [1, 0], "r2": [1, 0], "r3": [2, 1], "r4": [1, 0]})
    p = plan(region, churn=1.0)
    assert p.taken == {} and p.violations == (), (p.moves, p.violations)


def test_a_goals_move_never_takes_a_machine_back_from_the_free_pool():
    # msb1 is hot (two tasks of 0.9 core measured); msb2 is cool: msb2-0 has 0.5 core free, msb2-1
    # holds nothing (it goes back to the free pool at the round's end). A task of web/h (spread over
    # MSBs) fits only on the empty one: a move there (repair, or cooling msb1) would take a machine
    # out of the pool, so none is made
    a, b = machines("msb1", 2), machines("msb2", 2)
    tasks = [task("web/h", 0, "msb1-0", used=900), task("web/h", 1, "msb1-1", used=900),
             task("web/f", 0, "msb2-0", cpus=3500)]
    p = plan(Region([Group("web", "dc1", "msb1", a, tasks[:2]), Group("web", "dc1", "msb2", b, tasks[2:])]),
             churn=1.0, total_limit=1.0)
    assert all(mv.target != "msb2-1" for mv in p.moves) and "msb2-1" not in p.after.held, p.moves
    assert not any(mv.goal in ("repair", "hotspots") for mv in p.moves), p.moves
    # with room on msb2-0 (a task of 2 cores there), one of web/h goes to it
    tasks[2] = task("web/f", 0, "msb2-0", cpus=2000)
    p = plan(Region([Group("web", "dc1", "msb1", a, tasks[:2]), Group("web", "dc1", "msb2", b, tasks[2:])]),
             churn=1.0, total_limit=1.0)
    assert [(mv.job, mv.target) for mv in p.moves if mv.goal in ("repair", "hotspots")] == [("web/h", "msb2-0")], p.moves
    assert all(mv.target != "msb2-1" for mv in p.moves) and "msb2-1" not in p.after.held, p.moves
