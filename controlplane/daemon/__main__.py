import sys

from controlplane.daemon.controld import main

sys.exit(main())
