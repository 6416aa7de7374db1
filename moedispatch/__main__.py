"""``python -m moedispatch``: the same command line as the ``moedispatch`` console script."""

import sys

from moedispatch.cli import main

sys.exit(main())
