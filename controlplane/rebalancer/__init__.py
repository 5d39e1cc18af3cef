"""The ReBalancer (paper 2.2, 3.2): improves where things run after the allocator's fast decisions.

A round plans moves toward goals in lexicographic order on one board (board.py): repair (jobs
whose spread over MSBs the allocator left uneven for want of room), hotspots (MSBs whose measured
load is above the region's mean by more than a margin, machines above a hot share of their cores:
goals.py), then compaction (compaction.py: the machines of an entitlement whose tasks fit on its
other machines of the same MSB, freed whole for the free pool, with OR-Tools' CP-SAT per
(entitlement, MSB) group), the fewest moves within per-job churn budgets and cool-downs
throughout. view.py takes what it needs from the region's view, score.py scores each goal and
checks the rules on the result, plan.py puts it together and says it in words. Nothing here moves
a task: the moves are proposals (GET /v1/rebalance/plan, twinectl rebalance plan)."""
