"""The autotuner: search spaces from each op's tunables, measurement backends (cost model or
Trn2 hardware), and the results store the ops read at run time."""
