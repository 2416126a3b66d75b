"""`python -m kernels ...` is `python -m kernels.autotune ...`: tune ops, print and store the winners."""

import sys

from kernels.cli import main

sys.exit(main())
