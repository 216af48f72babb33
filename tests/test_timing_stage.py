"""The timing stage times a model's own supports in the model's own attention geometry."""
from pipelines.params import model_facts
from pipelines.timing import model_geometry


def test_model_supports_are_timed_in_the_models_geometry():
    facts = model_facts("data/models/wise-small")
    assert facts["heads"] == 4 and facts["kv_heads"] == 4 and facts["head_dim"] == 64
    assert model_geometry(4, facts, 96) == (4, 4, 64)
    gqa = {"heads": 32, "kv_heads": 8, "head_dim": 128}
    assert model_geometry(32, gqa, 96) == (32, 8, 128)
    # unknown model, heads that do not match, or a head_dim the kernel lacks: MHA at timing.head_dim
    assert model_geometry(4, None, 96) == (4, 4, 96)
    assert model_geometry(6, facts, 96) == (6, 6, 96)
    assert model_geometry(4, {**facts, "head_dim": 80}, 128) == (4, 4, 128)
    assert model_facts("preset:tiny-random@0")["head_dim"] > 0
