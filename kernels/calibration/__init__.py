"""Calibration fixtures, not ops: AWS's matmul-tutorial variants rewritten as NKI kernels
(``tutorial_matmul.py``), whose modeled latencies ``neuron-kernels calibrate`` compares with
AWS's published measurements (``perf_results/calibration/``). They are deliberately slow:
do not copy them, copy ``neuron_kernels.kernels.matmul``."""
