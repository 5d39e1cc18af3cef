"""`twine-controld`, the regional control daemon: its wiring (controld.py), its flags and config
file (config.py) and its watch on its own event loop (stalls.py). `python -m controlplane.daemon`
runs it."""
