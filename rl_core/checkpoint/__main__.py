"""``python -m rl_core.checkpoint ls|show|verify|gc|export URL ...``; see cli.py."""

import sys

from .cli import main

sys.exit(main())
