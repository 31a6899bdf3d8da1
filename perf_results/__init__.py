"""Tuned configs per target and op (``<target>/<op>.json``), read by the ops at run time,
and benchmark/calibration records. Data only."""
