import sys

from controlplane.daemon.main import main

sys.exit(main())
