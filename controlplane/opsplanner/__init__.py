"""The ops planner (paper 2.5): planned maintenance. Its records and per-machine calendar
(maintenance.py), its service (planner.py: schedule, list, end), and what jobs hear of it: the
maintenance that governs each machine and the advance notices sent to TaskControllers (notices.py)."""
