"""`python -m controlplane.devregion`: see the package's docstring."""

import sys

from controlplane.devregion.cli import main

sys.exit(main())
