"""Reference TaskControllers: leader-last (a ZooKeeper-style ensemble) and replica-aware (a
sharded service, paper Figure 2). Each is a real program: `python -m controlplane.taskcontrol.controllers.<name> --help`."""
