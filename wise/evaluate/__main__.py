"""`python -m wise.evaluate MODE ...`: the command line of wise/evaluate/__init__.py."""
import sys

from wise.evaluate import main

sys.exit(main())
