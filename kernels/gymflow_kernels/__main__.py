"""`python -m gymflow_kernels ...`: tune ops, print and store the winners (options: kernels/gymflow_kernels/cli.py)."""

import sys

from gymflow_kernels.cli import main

sys.exit(main())
