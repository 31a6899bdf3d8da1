"""``python -m neuron_kernels.cli``: the ``neuron-kernels`` command."""

import sys

from neuron_kernels.cli import main

sys.exit(main())
