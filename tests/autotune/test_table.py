"""The generated ``perf_results/<target>/README.md`` table (``autotune/table.py``)."""

from __future__ import annotations

import json

from neuron_kernels import tuned_configs
from neuron_kernels.autotune.table import render_table


def test_a_sliced_modeled_entry_says_how_many_slices_it_multiplied(tmp_path):
    """An attention entry tuned on one traced slice (``OpSpec.model_slice``) must say so in
    its row; an entry traced whole must not."""
    shipped = tuned_configs.shipped_dir() / "trn2" / "flash_attention_fwd.json"
    data = json.loads(shipped.read_text())
    sliced, whole = (dict(e, metric=dict(e["metric"])) for e in data["entries"][:2])
    sliced["metric"]["copies"] = 4
    whole["metric"].pop("copies", None)
    whole["metric"].pop("traced_problem", None)
    data["entries"] = [sliced, whole]
    (tmp_path / "flash_attention_fwd.json").write_text(json.dumps(data))
    rows = [r for r in render_table(tmp_path, "trn2").splitlines() if r.startswith("| flash")]
    assert len(rows) == 2
    assert "| modeled (slice x4) |" in rows[0]
    assert "| modeled |" in rows[1] and "slice" not in rows[1]
