"""`python -m gymflow_kernels ...`: tune ops, print and store the winners (options: gymflow_kernels/cli.py).

This is the tuner's entry point. Nothing imports `kernels.__main__`, so runpy runs it without the warning it gives for
`python -m gymflow_kernels.autotune` (a module the package has already imported when runpy gets to run it).
"""

import sys

from gymflow_kernels.cli import main

sys.exit(main())
