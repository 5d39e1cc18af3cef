"""The ReBalancer (paper 2.2, 3.2): improves where things run after the allocator's fast decisions.

This first step plans compaction only, as a dry run: the machines of an entitlement whose tasks fit
on its other machines of the same MSB, freed whole for the free pool (stranded capacity). view.py
takes what it needs from the region's view, compaction.py solves each (entitlement, MSB) group
with OR-Tools' CP-SAT, plan.py puts the groups' answers together and says them in words. Nothing
here moves a task: the moves are proposals (GET /v1/rebalance/plan, twinectl rebalance plan)."""
