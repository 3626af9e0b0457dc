import sys

from artifact.cli import main

sys.exit(main())
