"""Versions: the package's, and the cost model's (a modeled perf_results entry is only valid
for the cost-model version that produced it). Bump COST_MODEL_VERSION when a scheduling rule
or a parameter default changes modeled numbers."""

__version__ = "0.1.0"
COST_MODEL_VERSION = "1"
