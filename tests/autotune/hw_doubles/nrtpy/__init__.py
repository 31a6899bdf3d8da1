"""Test double of nrtpy as the measure worker uses it (see ../README.md).

Behaviours, each from aws-neuron/aws-neuron-sdk neuron-runtime/nrtpy/:

* model.rst: ``NrtpyModel.load_from_neff(neff_path, name=None, core_id=0, cc_enabled=False,
  rank_id=0, world_size=1)``; ``input_tensors_info`` / ``output_tensors_info`` map tensor
  names to metadata with ``shape`` and ``size``; ``model(inputs, outputs=None, ...)`` returns
  the auto-allocated outputs when ``outputs`` is None, inputs keyed by name ("Keys must match
  the NEFF input names"); ``benchmark(inputs, outputs=None, warmup_iter=5, benchmark_iter=5,
  mode="device")`` raises ValueError for a mode other than "device"/"host" or
  ``benchmark_iter`` < 1 and returns a ``BenchmarkResult`` with ``mean_ms``, ``min_ms``,
  ``max_ms``, ``std_dev_ms``, ``iterations``, ``warmup_iterations``, ``durations_ms``
  ("All timing values are in milliseconds").
* tensor.rst: ``NrtpyTensor.from_numpy(array, name=None, core_id=0)`` ("made contiguous before
  the copy"), ``.numpy()``, ``.shape``, ``.dtype``, ``.name``.
* tutorial-validate-benchmark.rst (note): auto-allocated outputs "may have a ``void`` dtype
  (for example, ``|V2`` for fp16)": this double always returns them as ``void``.
* configuration.rst: ``configure(visible_cores=None)`` "only sets the
  ``NEURON_RT_VISIBLE_CORES`` environment variable"; TypeError for an ``int``.
* errors.rst: ``NrtError`` (from libnrt) and ``NrtpyError``.
* about-neuron/arch/neuron-features/logical-neuroncore-config.rst: the runtime's LNC is the
  ``NEURON_LOGICAL_NC_CONFIG`` environment variable, 2 by default on Trainium2 ("LNC=2
  (default)"), and a NEFF must be compiled for it ("doesn't support setting the compiler flag
  to a different LNC configuration than the Neuron Runtime environment variable");
  nki/api/nki/__init__.py, ``jit``: "Mismatching the two will cause a runtime error". The
  double raises ``NrtError`` at load for a NEFF launched at another LNC.

Not the real thing: the NEFF is the nki double's JSON; the kernel runs on our interpreter and
its "device" durations are the cost model's latency for that run (modeled), with a fixed
+-0.4% spread over the iterations. ``output_tensors_info`` is filled by the first run.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import pickle

import hw_double_faults
import numpy as np

__version__ = "0.0-double"
NEFF_FORMAT = "neuron-kernels-test-double-neff/1"


class NrtError(RuntimeError):
    """An error from libnrt (errors.rst)."""


class NrtpyError(RuntimeError):
    """An error of nrtpy itself (errors.rst)."""


class TensorMetadata:
    def __init__(self, shape, size):
        self.shape, self.size = list(shape), int(size)


class NrtpyTensor:
    def __init__(self, tensor_ref, shape, dtype, name=None):
        self._data = tensor_ref
        self.shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.dtype, self.name = np.dtype(dtype), name

    @classmethod
    def from_numpy(cls, array, name=None, core_id=0):
        data = np.ascontiguousarray(array).copy()
        return cls(data, data.shape, data.dtype, name)

    def write_from_numpy(self, array):
        array = np.ascontiguousarray(array)
        if array.nbytes != self._data.nbytes:
            raise ValueError("byte size does not match the tensor's")
        self._data = array.copy().view(self._data.dtype).reshape(self._data.shape)

    def numpy(self):
        return self._data.copy()


class BenchmarkResult:
    def __init__(self, durations_ms, warmup_iterations):
        d = np.asarray(durations_ms, dtype=np.float64)
        self.durations_ms = [float(x) for x in d]
        self.mean_ms, self.min_ms, self.max_ms = float(d.mean()), float(d.min()), float(d.max())
        self.std_dev_ms = float(d.std())
        self.iterations, self.warmup_iterations = len(d), int(warmup_iterations)


def configure(visible_cores=None):
    if isinstance(visible_cores, int):
        raise TypeError("visible_cores must be an iterable of core ids, not an int")
    if visible_cores is not None:
        os.environ["NEURON_RT_VISIBLE_CORES"] = ",".join(str(int(c)) for c in visible_cores)


def reset():
    pass


def _from_bits(array, dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes

        return array.view(np.uint16).view(ml_dtypes.bfloat16)
    return array.view(np.dtype(dtype))


class NrtpyModel:
    def __init__(self, neff: dict, name: str):
        self._neff, self.name = neff, name
        self.input_tensors_info = {
            e["name"]: TensorMetadata(e["shape"], int(np.prod(e["shape"]))) for e in neff["inputs"]
        }
        self.output_tensors_info = {}
        self._latency_ms = None

    @classmethod
    def load_from_neff(
        cls, neff_path, name=None, core_id=0, cc_enabled=False, rank_id=0, world_size=1
    ):
        played = hw_double_faults.fault("load")
        if played == "crash":
            os.abort()  # libnrt takes the process down
        if played == "hang":
            hw_double_faults.hang()  # a load that never returns
        try:
            neff = json.loads(open(neff_path).read())
        except (OSError, ValueError) as exc:
            raise NrtError(f"NRT Error: failed to load {neff_path}: {exc}") from None
        if neff.get("format") != NEFF_FORMAT:
            raise NrtError(f"NRT Error: {neff_path} is not a NEFF")
        default = "2" if neff.get("target") in ("trn2", "trn3") else "1"
        runtime_lnc = int(os.environ.get("NEURON_LOGICAL_NC_CONFIG") or default)
        if int(neff.get("lnc") or 1) != runtime_lnc:
            raise NrtError(
                f"NRT Error: {neff_path} was compiled for LNC={neff.get('lnc') or 1}, the "
                f"runtime runs at NEURON_LOGICAL_NC_CONFIG={runtime_lnc}"
            )
        hw_double_faults.log("load", neff=str(neff_path), core_id=core_id)
        return cls(neff, name or os.path.splitext(os.path.basename(str(neff_path)))[0])

    def _run(self, inputs):
        if sorted(inputs) != sorted(self.input_tensors_info):
            raise NrtpyError(
                f"input names {sorted(inputs)} do not match the NEFF's "
                f"{sorted(self.input_tensors_info)}"
            )
        from neuron_kernels.cost_model.schedule import model_trace
        from neuron_kernels.interpreter import run

        dtypes = {e["name"]: e["dtype"] for e in self._neff["inputs"]}
        arrays = {
            n: _from_bits(t.numpy(), dtypes[n]).reshape(self.input_tensors_info[n].shape)
            for n, t in inputs.items()
        }
        constants = pickle.loads(base64.b64decode(self._neff["constants"]))
        args = []
        for a in self._neff["args"]:
            if "tensor" in a:
                args.append(arrays[a["tensor"]])
            elif "tensors" in a:
                args.append(tuple(arrays[k] for k in a["tensors"]))
            else:
                args.append(constants[a["constant"]])
        module = importlib.import_module(self._neff["module"])
        kernel = getattr(module, self._neff["name"])
        lnc = int(self._neff.get("lnc") or 1)  # the NEFF runs at the LNC it was compiled for
        launch = kernel[lnc] if lnc > 1 else kernel
        result = run(launch, tuple(args), {}, target=self._neff["target"], compute=True)
        self._latency_ms = model_trace(result.trace, result.target).latency_ns / 1e6
        outs = result.outputs if isinstance(result.outputs, (tuple, list)) else (result.outputs,)
        arrays_out = []
        for o in outs:
            a = o.detach().float().numpy() if hasattr(o, "detach") else np.asarray(o)
            if hasattr(o, "dtype") and str(o.dtype).endswith("bfloat16"):
                import ml_dtypes

                a = a.astype(ml_dtypes.bfloat16)
            elif hasattr(o, "dtype") and str(o.dtype).endswith("float16"):
                a = a.astype(np.float16)
            arrays_out.append(np.ascontiguousarray(a))
        return arrays_out

    def __call__(self, inputs, outputs=None, save_trace=False, ntff_name=None):
        produced = self._run(inputs)
        if hw_double_faults.fault("call") == "wrong":
            produced = [(a.astype(np.float32) + 1.0).astype(a.dtype) for a in produced]
        self.output_tensors_info = {
            f"output_{i}": TensorMetadata(a.shape, a.size) for i, a in enumerate(produced)
        }
        hw_double_faults.log("call", neff=self.name)
        # the void dtype of the note in tutorial-validate-benchmark.rst
        return {
            f"output_{i}": NrtpyTensor(
                a.view(np.dtype(f"V{a.dtype.itemsize}")),
                a.shape,
                f"V{a.dtype.itemsize}",
                f"output_{i}",
            )
            for i, a in enumerate(produced)
        }

    def benchmark(self, inputs, outputs=None, warmup_iter=5, benchmark_iter=5, mode="device"):
        if mode not in ("device", "host"):
            raise ValueError(f"mode must be 'device' or 'host', got {mode!r}")
        if benchmark_iter < 1:
            raise ValueError("benchmark_iter must be at least 1")
        if self._latency_ms is None:
            self._run(inputs)
        hw_double_faults.log("benchmark", mode=mode, iterations=benchmark_iter)
        spread = [1.0 + 0.002 * ((i % 5) - 2) for i in range(benchmark_iter)]
        return BenchmarkResult([self._latency_ms * s for s in spread], warmup_iter)
