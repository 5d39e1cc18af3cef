"""What twine-agent's commands share: their exit codes (scripts rely on them) and JSON output.

  0  done; every setting holds (settings not applicable on this host are reported, not errors)
  1  a setting failed: an apply was rolled back, or verify found settings that do not hold
  2  bad input: a malformed or invalid profile, desired-state or config file; nothing was changed
  3  the agent or the host is not reachable / not ready (status, docker)
"""

from __future__ import annotations

import json
import sys

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_UNAVAILABLE = 0, 1, 2, 3


def dump(data: object) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
