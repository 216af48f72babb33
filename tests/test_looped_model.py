"""The looped retrofit on tiny random Qwen3 and Llama bases (built with transformers, no download):
the safe floor, Loop Memory Attention's locality and initial gates, the state's memory layout, the
WISE seam, every runner condition, and the checkpoint round trip."""
import json

import pytest
import torch

from wise.engine.conditions import CONDITIONS
from wise.models.looped.base import build_base, parameter_count
from wise.models.looped.checkpoint import load_retrofit, save_retrofit
from wise.models.looped.lma import LoopMemoryAttention, alibi_slopes
from wise.models.looped.model import LoopedModel, build_looped, check_safe_floor
from wise.engine.runner import PAPER_SETTINGS, WiseSettings, run_condition, state_seed

TINY = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
        "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}
LMA = {"block_start": 2, "block_layers": 2, "window": 3, "lma_heads": 2, "lma_head_dim": 8, "gate_hidden": 4}


def tiny_base(family: str, seed: int = 0):
    fields = dict(TINY, tie_word_embeddings=family == "qwen3")
    return build_base(family, seed, **fields).eval()


def ids_of(n: int, seed: int = 0, batch: int = 1) -> torch.Tensor:
    return torch.randint(3, TINY["vocab_size"], (batch, n), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(params=["qwen3", "llama"])
def family(request):
    return request.param


@torch.no_grad()
def test_one_loop_reproduces_the_base_exactly(family):
    base = tiny_base(family)
    ids = ids_of(37, batch=2)
    reference = base(input_ids=ids).logits.float()
    for use_lma in (True, False):
        model = build_looped(base, **dict(LMA, use_lma=use_lma))
        assert torch.equal(model(ids, 1), reference)
        # the same through the runner's pieces
        rope = model.rotary(ids.shape[1])
        e = model.embed(ids, rope)
        s = model.core_step(model.initial_state(e), e, 1, rope)
        assert torch.equal(model.readout(s, rope), reference)
        # and through the runner's own initial state and prefix (t_d = T = 1)
        from wise.engine.runner import initial_state

        assert torch.equal(model.readout(model.core_step(initial_state(model, e, 3), e, 1, rope), rope), reference)
    # with trained (non-zero) gates too: a single loop never reaches the added modules
    with torch.no_grad():
        model.alpha.fill_(0.7)
    assert torch.equal(model(ids, 1), reference)
    check_safe_floor(model)  # the check training runs before it starts


def test_safe_floor_check_fails_when_one_loop_is_not_the_base(monkeypatch):
    import wise.models.looped.model as looped_model

    model = build_looped(tiny_base("qwen3"), **LMA)
    check_safe_floor(model)
    original = looped_model.apply_layer  # the looped path's layers, off by a hair
    monkeypatch.setattr(looped_model, "apply_layer", lambda layer, h, pos: original(layer, h, pos) * 1.0001)
    with pytest.raises(AssertionError, match="safe floor"):
        check_safe_floor(model)


@torch.no_grad()
def test_more_loops_change_the_output_and_base_weights_stay_frozen(family):
    base = tiny_base(family)
    model = build_looped(base, **LMA)
    ids = ids_of(20)
    assert not torch.equal(model(ids, 3), model(ids, 1))
    assert all(not p.requires_grad for p in model.base.parameters())
    assert all(p.requires_grad for _, p in model.added_named_parameters())
    assert {n.split(".")[0] for n, _ in model.added_named_parameters()} == {"alpha", "inject_norm", "lma"}


def test_lma_never_mixes_positions():
    torch.manual_seed(0)
    lma = LoopMemoryAttention(32, heads=4, head_dim=8, gate_hidden=8, eps=1e-6, norm_cls=torch.nn.RMSNorm,
                              gamma_init=1.0, gate_bias_init=0.0)
    lma.reset_parameters(torch.Generator().manual_seed(1), std=0.2)
    memory = torch.randn(2, 9, 3, 32, generator=torch.Generator().manual_seed(2))
    distance = torch.arange(1, 4)
    out = lma(memory, distance)
    assert out.abs().max() > 1e-3  # open gates: the check below is not vacuous
    for i in (0, 4, 8):
        bumped = memory.clone()
        bumped[:, i] += torch.randn(2, 3, 32, generator=torch.Generator().manual_seed(10 + i))
        moved = lma(bumped, distance)
        others = [j for j in range(9) if j != i]
        assert torch.equal(moved[:, others], out[:, others])
        assert not torch.allclose(moved[:, i], out[:, i])


@torch.no_grad()
def test_gates_start_near_zero_so_lma_adds_almost_nothing(family):
    base = tiny_base(family)
    lma_model = build_looped(base, **LMA)
    plain = build_looped(base, **dict(LMA, use_lma=False))
    for lma in lma_model.lma:
        assert float(lma.gamma) == pytest.approx(0.01)
        assert torch.equal(lma.slopes, alibi_slopes(2))
    ids = ids_of(25)
    rope = lma_model.rotary(25)
    e = lma_model.embed(ids, rope)
    s = lma_model.core_step(lma_model.initial_state(e), e, 1, rope)
    memory = s.view(1, 25, 1 + lma_model.config.memory_slots, 64)[:, :, 1:4]  # block layer 0's slots
    update = lma_model.lma[0](memory[:, :, :1], torch.arange(1, 2))
    gate = lma_model.lma[0].token_gate(memory[:, :, :1])
    assert float(gate.max()) < 0.06  # sigmoid(-3) = 0.047, up to the small random MLP
    assert float(update.norm() / memory[:, :, 0].norm()) < 1e-3
    # the whole model: LMA and plain looping differ only slightly at initialisation
    a, b = lma_model(ids, 4), plain(ids, 4)
    assert 0 < float((a - b).abs().max()) < 1e-2 * float(b.abs().max())


def test_alibi_slopes():
    assert torch.allclose(alibi_slopes(4), torch.tensor([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8]))
    assert torch.allclose(alibi_slopes(8)[:2], torch.tensor([2 ** -1, 2 ** -2]))
    six = alibi_slopes(6)  # 4 from the power below, then every other one of the power above
    assert torch.allclose(six, torch.tensor([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]))


@torch.no_grad()
def test_state_carries_each_block_layers_last_outputs():
    base = tiny_base("qwen3")
    model = build_looped(base, **LMA)
    ids = ids_of(11)
    rope = model.rotary(11)
    e = model.embed(ids, rope)
    s = model.initial_state(e)
    k, W, h = 2, 3, 64
    assert s.shape == e.shape and not s.any()  # s0 = 0, as the runner draws it for this config
    from wise.engine.runner import initial_state

    assert torch.equal(initial_state(model, e, seed=7), s)
    history = []
    for t in range(1, 6):
        s = model.core_step(s, e, t, rope)
        assert s.shape == (1, 11, (1 + k * W) * h)
        slots = s.view(1, 11, 1 + k * W, h)
        history.append(slots.clone())
        # the last block layer's newest output is h itself
        assert torch.equal(slots[:, :, 1 + (k - 1) * W], slots[:, :, 0])
        for j in range(1, W):  # slot j of loop t is slot 0 of loop t - j; zeros before loop 1
            for layer in range(k):
                slot = slots[:, :, 1 + layer * W + j]
                if t - j >= 1:
                    assert torch.equal(slot, history[t - 1 - j][:, :, 1 + layer * W])
                else:
                    assert not slot.any()
    plain = build_looped(base, **dict(LMA, use_lma=False))
    assert plain.core_step(plain.initial_state(e), e, 1, rope).shape == e.shape  # no memory without LMA


class RecordingPolicy:
    """Full causal attention that records where it was called from."""

    def __init__(self):
        self.calls = []

    def __call__(self, q, k, v, *, step, layer):
        from wise.models.recurrent import causal_attention

        self.calls.append((step, layer, tuple(q.shape), tuple(k.shape)))
        return causal_attention(q, k, v)


class RecordingObserver:
    def __init__(self):
        self.attn, self.states = [], []

    def on_attention(self, step, layer, q, k, v, out):
        self.attn.append((step, layer, tuple(out.shape)))

    def on_state(self, step, state):
        self.states.append((step, tuple(state.shape)))


@torch.no_grad()
def test_block_attention_goes_through_the_policy_seam(family):
    base = tiny_base(family)
    model = build_looped(base, **LMA)
    ids = ids_of(30)
    policy, observer = RecordingPolicy(), RecordingObserver()
    routed = model(ids, 3, policy=policy, observer=observer)
    # block layers only, indexed inside the block, q [b, H, n, d] and k [b, Hkv, n, d] as the policies take
    assert [(s, l) for s, l, _, _ in policy.calls] == [(t, l) for t in (1, 2, 3) for l in (0, 1)]
    assert all(q == (1, 4, 30, 16) and k == (1, 2, 30, 16) for _, _, q, k in policy.calls)
    assert [(s, l) for s, l, _ in observer.attn] == [(t, l) for t in (1, 2, 3) for l in (0, 1)]
    assert [s for s, _ in observer.states] == [1, 2, 3]
    assert all(shape == (1, 30, 64) for _, shape in observer.states)  # observers see h
    assert torch.allclose(routed, model(ids, 3), atol=1e-5)
    # a policy that drops the block's attention changes the output: the seam is really used
    zero = lambda q, k, v, step, layer: torch.zeros_like(q)  # noqa: E731
    assert not torch.allclose(model(ids, 3, policy=zero), routed, atol=1e-3)
    # the prefix and suffix layers never reach the seam, and a bare base forward is untouched
    assert torch.equal(base(input_ids=ids).logits.float(), model(ids, 1))


@pytest.mark.parametrize("fam", ["qwen3", "llama"])
def test_every_runner_condition_runs_on_the_looped_model(fam):
    model = build_looped(tiny_base(fam), **LMA)
    settings = WiseSettings(steps=8, discovery_step=3, window=2, block_size=16, eta=0.95, backend="reference")
    ids = ids_of(50)[0]
    seed = state_seed("ex", 0)
    results = {c: run_condition(model, ids, c, settings, seed) for c in CONDITIONS}
    assert len({r.state_hash for r in results.values()}) == 1  # identical through t_d
    full = results["full"].logits
    assert torch.allclose(full, model(ids[None], 8)[0], atol=1e-5)
    assert torch.allclose(results["truncate"].logits, model(ids[None], 3)[0], atol=1e-5)
    for c in ("wise", "static95", "mass_matched", "size_matched", "freeze_a"):
        r = results[c]
        assert r.layouts.shape == (2, 4, 4, 4)  # block layers, heads, query blocks, key blocks
        assert torch.isfinite(r.logits).all()
    # eta = 1 keeps every causal block: the reference late attention then equals Full
    dense = run_condition(model, ids, "wise", PAPER_SETTINGS.replace(steps=8, discovery_step=3, window=2,
                                                            block_size=16, eta=1.0), seed)
    assert torch.allclose(dense.logits, full, atol=1e-4)


@torch.no_grad()
def test_checkpoint_round_trip_and_base_fingerprint(tmp_path):
    from wise.model_files.fingerprint import base_fingerprint
    from wise.models.looped.checkpoint import base_pointer
    from wise.models import load_checkpoint
    from wise.models.checkpoint import load_config

    base = tiny_base("qwen3")
    base.save_pretrained(tmp_path / "base")
    out = tmp_path / "retrofit"
    model = build_looped(base, base_pointer(str(tmp_path / "base"), out), base_fingerprint(tmp_path / "base"),
                         **LMA)
    with torch.no_grad():
        model.alpha.fill_(0.3)
        model.lma[1].gamma.fill_(0.5)
    save_retrofit(model, out)
    assert json.loads((out / "config.json").read_text())["base"] == "../base"
    loaded = load_checkpoint(str(out))  # wise.models dispatches on model_type
    assert isinstance(loaded, LoopedModel)
    ids = ids_of(19)
    assert torch.equal(loaded(ids, 4), model(ids, 4))
    cfg = load_config(out)
    assert (cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.max_positions, cfg.eos_token_id) == (4, 2, 16, 512, 1)
    counts = model.parameter_counts()
    assert counts["base"] == parameter_count(base) and counts["added"] == sum(
        t.numel() for t in model.added_state_dict().values())
    # a different base is refused
    other = tiny_base("qwen3", seed=1)
    other.save_pretrained(tmp_path / "base")
    with pytest.raises(ValueError, match="fingerprint"):
        load_retrofit(out)


def test_kernel_backend_matches_the_reference_on_the_looped_model():
    """The Triton block-sparse kernel (interpreter on the CPU) behind the seam gives the reference
    late attention's result (head_dim 64: a size the kernel compiles for)."""
    base = build_base("qwen3", 0, **dict(TINY, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                                         num_hidden_layers=4)).eval()
    model = build_looped(base, block_start=1, block_layers=2, lma_heads=1, lma_head_dim=8, gate_hidden=2)
    ids = ids_of(64)[0]
    out = {be: run_condition(model, ids, "wise", PAPER_SETTINGS.replace(
        steps=4, discovery_step=2, window=1, block_size=16, backend=be), 0)
           for be in ("reference", "kernel")}
    assert out["kernel"].state_hash == out["reference"].state_hash
    assert torch.equal(out["kernel"].layouts, out["reference"].layouts)
    assert torch.allclose(out["kernel"].logits, out["reference"].logits, atol=1e-4)


@pytest.mark.parametrize("fam", ["qwen3", "llama"])
def test_cached_decoding_equals_rerun_on_the_looped_model(fam):
    """wise.engine.decoding's KV-cached generation (new rows run their loops against the prompt's cached
    keys and values, their loop memory in their own state rows) matches re-running everything."""
    from wise.engine.decoding import evaluate_example

    model = build_looped(tiny_base(fam), **LMA)
    with torch.no_grad():  # open gates, so the memory and the re-injection matter
        model.alpha.fill_(0.5)
        for lma in model.lma:
            lma.gamma.fill_(0.5)
    settings = PAPER_SETTINGS.replace(steps=6, discovery_step=3, window=2, block_size=16)
    prompt = ids_of(40)[0].tolist()
    answer = [5, 6, 7]
    runs = {g: evaluate_example(model, prompt, answer, CONDITIONS, settings, state_seed("ex", 0), max_new_tokens=3,
                                stop_ids={1}, generation=g) for g in ("cached", "rerun")}
    for c in CONDITIONS:
        cached, rerun = runs["cached"][c], runs["rerun"][c]
        assert cached.state_hash == rerun.state_hash
        assert cached.gold_logprob == pytest.approx(rerun.gold_logprob, abs=1e-4)
        if c in ("full", "truncate"):  # support-free: the same tokens (other conditions may
            assert cached.tokens == rerun.tokens  # rediscover a different support on rerun)


@torch.no_grad()
def test_the_prompt_keeps_prelude_and_coda_keys_with_the_same_numbers(family):
    """Cached decoding reads the prefix / suffix layers' keys through the plain-layer seam: recording
    them changes no number, and a new row run on its own against them equals the whole-sequence pass."""
    from wise.engine.appended_rows import Cache
    from wise.engine.extension import _Plain
    from wise.engine.runner import caches_layers, embed_recording, readout_recording

    model = build_looped(tiny_base(family), **LMA)
    assert caches_layers(model)
    ids = ids_of(31)
    rope = model.rotary(31)
    e, kvs = embed_recording(model, ids[:, :30], model.rotary(30))
    assert torch.equal(e, model.embed(ids[:, :30], model.rotary(30)))
    assert len(kvs) == LMA["block_start"] and kvs[0][0].shape == (1, TINY["num_key_value_heads"], 30, 16)
    s = torch.randn(1, 30, TINY["hidden_size"])
    at = (torch.zeros(1, dtype=torch.long), torch.tensor([29]))
    logits, coda = readout_recording(model, s, model.rotary(30), at)
    assert torch.equal(logits, model.readout(s, model.rotary(30), at=at))
    assert len(coda) == TINY["num_hidden_layers"] - LMA["block_start"] - LMA["block_layers"]
    # the 31st token's prefix on its own row, against the cached keys, equals the whole pass
    attends = [_Plain(Cache([(k, v, 1, True)]), None) for k, v in kvs]
    row = model.embed_rows(ids[:, 30:], rope.rows(30, 31), attends)
    assert torch.allclose(row, model.embed(ids, rope)[:, 30:], atol=1e-5)


def test_decoding_sizes_its_gpu_batches_from_the_looped_config():
    """The GPU path's cache estimate (examples and conditions decoded together) reads the config's
    core-layer count, heads and widths; the looped config answers it."""
    from wise.engine.decode_memory import cache_bytes

    model = build_looped(tiny_base("llama"), **LMA)
    settings = PAPER_SETTINGS.replace(steps=6, discovery_step=3, window=2, block_size=16)
    prefix, row, frozen = cache_bytes(model, settings, 40, CONDITIONS)
    per_step = LMA["block_layers"] * 2 * 40 * TINY["num_key_value_heads"] * 16 * 4
    assert prefix == 3 * per_step and frozen == LMA["block_layers"] * TINY["num_attention_heads"] * 40 * 40 * 4
    assert row > 3 * per_step


@torch.no_grad()
def test_a_cached_prefix_is_the_uncached_one_bit_for_bit(family):
    """Keeping keys for cached decoding leaves full attention to the looped model's own
    implementation, so the prefix states (and so the discovery masses and supports) are those of
    the traces' uncached run on any device (on an H200 they once differed and a support flipped)."""
    from wise.engine.runner import KVRecorder, run_prefix

    model = build_looped(tiny_base(family), **LMA)
    assert KVRecorder(model=model).defer
    settings = PAPER_SETTINGS.replace(steps=6, discovery_step=3, window=2, block_size=16)
    ids = ids_of(40)[0]
    cached = run_prefix(model, ids, settings, state_seed("ex", 0), cache=True)
    plain = run_prefix(model, ids, settings, state_seed("ex", 0), cache=False)
    assert torch.equal(cached.state, plain.state) and cached.state_hash == plain.state_hash
    assert all(torch.equal(a, b) for a, b in zip(cached.masses.window, plain.masses.window))


def test_the_coda_reads_out_long_prompts_a_few_rows_at_a_time(monkeypatch):
    """A row group's coda runs in row chunks whose attention scores fit (18 rows of 8K tokens once asked an
    80 GB GPU for 40 GiB): one row per call gives the numbers of all rows at once, and the chunk size follows
    the heads and the prompt length."""
    import wise.engine.appended_rows as appended_rows
    from wise.engine.decode_memory import CPU_BATCH_BYTES, readout_rows
    from wise.engine.decoding import evaluate_example

    model = build_looped(tiny_base("llama"), **LMA)
    per_row = 2 * TINY["num_attention_heads"] * 8192 * 8192 * 4
    assert readout_rows(model, 8192, 64) == min(64, CPU_BATCH_BYTES // per_row) and readout_rows(model, 10**6, 3) == 1
    assert readout_rows(model, 40, 5) == 5
    settings = PAPER_SETTINGS.replace(steps=6, discovery_step=3, window=2, block_size=16)
    runs = {}
    for step in (None, 1):
        if step:
            monkeypatch.setattr(appended_rows, "readout_rows", lambda model, n, rows: step)
        runs[step] = evaluate_example(model, ids_of(40)[0].tolist(), [5, 6, 7], CONDITIONS, settings,
                                      state_seed("ex", 0), max_new_tokens=3, stop_ids={1}, generation="cached")
    for c in CONDITIONS:
        assert runs[1][c].tokens == runs[None][c].tokens and runs[1][c].token_logprobs == runs[None][c].token_logprobs
        assert runs[1][c].gold_logprob == runs[None][c].gold_logprob
