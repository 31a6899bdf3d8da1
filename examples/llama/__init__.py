"""A small Llama-style decoder trained on deterministic synthetic tokens: the migration
example that ``neuron-kernels parity`` runs twice (plain PyTorch vs the NKI kernels).

Run it as a script (``python examples/llama/train.py --kernels``); the package form exists
so the parity command can import it without putting ``model``/``data`` on ``sys.path``.
"""
