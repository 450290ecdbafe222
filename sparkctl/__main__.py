import sys

from sparkctl.cli.main import main

sys.exit(main())
