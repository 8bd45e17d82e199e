import sys

from tensorgate.cli.main import main

sys.exit(main())
