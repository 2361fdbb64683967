"""`python -m unmask ...` and `torchrun ... -m unmask pretrain ...` run the `unmask` command."""

import sys

from unmask.cli import main

sys.exit(main())
