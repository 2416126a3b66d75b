"""`python -m kernels ...`: tune ops, print and store the winners (options: kernels/cli.py).

This is the tuner's entry point. Nothing imports `kernels.__main__`, so runpy runs it without the warning it gives for
`python -m kernels.autotune` (a module the package has already imported when runpy gets to run it).
"""

import sys

from kernels.cli import main

sys.exit(main())
