"""The engine-level cost model: an interpreter trace scheduled on per-engine timelines.

* :func:`model_trace` turns one :class:`~neuron_kernels.interpreter.Trace` into a
  :class:`ModeledTimeline` (parameters per target from :mod:`.params`, each with its source);
* :func:`profile` / :class:`Profiler` run kernels on the interpreter and report modeled
  latency, engine busy time, utilization, HBM traffic and on-chip peaks;
* :mod:`.timeline_export` writes Chrome/Perfetto JSON and PNG timelines.

Every number this package produces is *modeled*, never measured. It depends on the
interpreter and the hardware table only, never on the kernels or the ops.
"""

from neuron_kernels.cost_model.params import PARAMS, CostParams, params_for
from neuron_kernels.cost_model.profiler import LaunchProfile, Profile, Profiler, profile
from neuron_kernels.cost_model.schedule import MODEL_VERSION, ModeledTimeline, model_trace

__all__ = [
    "MODEL_VERSION",
    "PARAMS",
    "CostParams",
    "params_for",
    "model_trace",
    "ModeledTimeline",
    "profile",
    "Profiler",
    "Profile",
    "LaunchProfile",
]
