import sys

from fleetctl.cli.main import main

sys.exit(main())
