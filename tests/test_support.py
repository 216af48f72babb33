"""Support rules on hand-computed block masses."""
import math

import numpy as np
import pytest
import torch

from wise.engine import support as S

# n = 5 tokens, B = 2 -> blocks {0,1}, {2,3}, {4}: the last block is partial (1 real row).
ATTN5 = torch.tensor(
    [
        [1.0, 0.0, 0.0, 0.0, 0.0],
        [0.5, 0.5, 0.0, 0.0, 0.0],
        [0.2, 0.2, 0.6, 0.0, 0.0],
        [0.1, 0.1, 0.4, 0.4, 0.0],
        [0.1, 0.2, 0.3, 0.1, 0.3],
    ]
)
# r[1,0] = (0.4 + 0.2)/2, r[1,1] = (0.6 + 0.8)/2; row 2 has one real row, so no averaging.
MASS5 = torch.tensor([[1.0, 0.0, 0.0], [0.3, 0.7, 0.0], [0.3, 0.4, 0.3]])


def _random_attn(shape, n, seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(*shape, n, n, generator=g) * 3
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)


def _naive_block_mass(attn, B):
    n = attn.shape[-1]
    M = math.ceil(n / B)
    out = torch.zeros(*attn.shape[:-2], M, M, dtype=torch.float64)
    for q in range(M):
        rows = range(q * B, min(n, (q + 1) * B))
        for b in range(M):
            cols = slice(b * B, min(n, (b + 1) * B))
            out[..., q, b] = sum(attn[..., i, cols].double().sum(-1) for i in rows) / len(rows)
    return out


def test_block_mass_hand_computed_partial_last_block():
    r = S.block_mass(ATTN5, 2)
    assert r.dtype == torch.float32 and r.shape == (3, 3)
    torch.testing.assert_close(r, MASS5)


@pytest.mark.parametrize("n,B", [(7, 3), (8, 4), (33, 8), (5, 16)])
def test_block_mass_matches_naive_loop(n, B):
    attn = _random_attn((2, 3), n, seed=n * 100 + B)
    r = S.block_mass(attn, B)
    torch.testing.assert_close(r.double(), _naive_block_mass(attn, B), atol=1e-6, rtol=0)
    # Every row of a causal softmax keeps total mass 1 after block averaging.
    torch.testing.assert_close(r.sum(-1), torch.ones(r.shape[:-1]))


def test_block_mass_bf16_input_is_summed_in_fp32():
    attn = _random_attn((4,), 64, seed=3)
    r = S.block_mass(attn.bfloat16(), 16)
    assert r.dtype == torch.float32
    torch.testing.assert_close(r, S.block_mass(attn, 16), atol=2e-2, rtol=0)


def test_mass_support_hand_computed_and_tie_to_lower_index():
    # Row 2 ranks 0.4 (b1), then the 0.3 tie b0 before b2.
    got = S.mass_support(MASS5, 0.95)
    assert got.tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    got = S.mass_support(MASS5, 0.6)
    assert got.tolist() == [[True, False, False], [False, True, False], [True, True, False]]
    # 0.7 reached exactly by the top block of row 1 (float32 0.7 counts as reaching 0.7).
    assert S.mass_support(MASS5, 0.7)[1].tolist() == [False, True, False]


def test_mass_support_all_mass_on_one_block_and_ties():
    mass = torch.tensor(
        [
            [1.0, 0.0, 0.0, 0.0],
            [0.0, 1.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 1.0],  # mass above the diagonal must be ignored
            [0.25, 0.25, 0.25, 0.25],
        ]
    )
    got = S.mass_support(mass, 0.95)
    assert got.tolist() == [
        [True, False, False, False],
        [False, True, False, False],
        [True, False, False, False],  # all-zero causal row: never empty, lowest index wins ties
        [True, True, True, True],
    ]
    # Exact tie: 0.5 needs two of four equal blocks, taken from the lowest key index.
    assert S.mass_support(mass, 0.5)[3].tolist() == [True, True, False, False]


def test_mass_support_eta_one_keeps_exactly_positive_blocks():
    mass = torch.tensor([[1.0, 0, 0, 0], [0.2, 0.8, 0, 0], [0.0, 0.5, 0.5, 0], [0.1, 0.0, 0.6, 0.3]])
    got = S.mass_support(mass, 1.0)
    assert got.tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [False, True, True, False],
        [True, False, True, True],
    ]
    # On real attention, eta = 1.0 keeps every causal block with nonzero mass despite fp32 rounding.
    r = S.block_mass(_random_attn((3,), 40, seed=1), 8)
    causal = S.causal_block_mask(5)
    assert torch.equal(S.mass_support(r, 1.0), (r > 0) & causal)


def test_mass_support_is_minimal_causal_and_nonempty_on_random():
    r = S.block_mass(_random_attn((2, 4), 70, seed=7), 8)  # M = 9, partial last block
    eta = 0.9
    sup = S.mass_support(r, eta)
    causal = S.causal_block_mask(9)
    assert not (sup & ~causal).any()
    assert (sup.sum(-1) >= 1).all()
    kept = (r * sup).sum(-1)
    assert (kept >= eta * r.sum(-1) - 1e-6).all()
    # Minimal: dropping the smallest kept block falls short of eta (rows with > 1 block).
    smallest = torch.where(sup, r, torch.inf).amin(-1)
    multi = sup.sum(-1) > 1
    assert ((kept - smallest)[multi] < eta * r.sum(-1)[multi]).all()


def test_working_set_is_union_and_accepts_list_or_tensor():
    m1 = torch.tensor([[1.0, 0.0], [0.9, 0.1]])
    m2 = torch.tensor([[1.0, 0.0], [0.1, 0.9]])
    expect = [[True, False], [True, True]]
    assert S.working_set([m1, m2], 0.8).tolist() == expect
    assert S.working_set(torch.stack([m1, m2]), 0.8).tolist() == expect
    assert S.working_set([m1], 0.8).tolist() == [[True, False], [True, False]]


def test_static_support_defaults_to_eta_095():
    assert torch.equal(S.static_support(MASS5), S.mass_support(MASS5, 0.95))


def test_mass_matched_hand_computed():
    mass1 = torch.tensor([[1.0, 0, 0, 0], [0.6, 0.4, 0, 0], [0.5, 0.3, 0.2, 0], [0.1, 0.2, 0.3, 0.4]])
    wise = torch.tensor(
        [[1, 0, 0, 0], [0, 1, 0, 0], [0, 1, 1, 0], [1, 1, 1, 0]], dtype=torch.bool
    )
    # Targets 1.0, 0.4, 0.5, 0.6: row 1 needs only its top block (0.6 >= 0.4); row 2 one block
    # (0.5); row 3 takes 0.4 then 0.3 (0.7 >= 0.6).
    got = S.mass_matched_support(mass1, wise)
    assert got.tolist() == [
        [True, False, False, False],
        [True, False, False, False],
        [True, False, False, False],
        [False, False, True, True],
    ]


def test_mass_matched_reaches_target_minimally_on_random():
    r1 = S.block_mass(_random_attn((3, 2), 96, seed=11), 16)
    r9 = S.block_mass(_random_attn((3, 2), 96, seed=12), 16)
    wise = S.working_set([r9], 0.95)
    mm = S.mass_matched_support(r1, wise)
    target = (r1 * wise).sum(-1)
    kept = (r1 * mm).sum(-1)
    assert (kept >= target * (1 - 1e-6)).all()
    smallest = torch.where(mm, r1, torch.inf).amin(-1)
    multi = mm.sum(-1) > 1
    assert ((kept - smallest)[multi] < target[multi]).all()
    # The top-k prefix is the max-mass k-set, so it never needs more blocks than WISE.
    assert (mm.sum(-1) <= wise.sum(-1)).all()


def test_size_matched_cardinality_per_row_on_random():
    r1 = S.block_mass(_random_attn((4, 3), 150, seed=5), 16)  # M = 10, partial last block
    wise = S.working_set([S.block_mass(_random_attn((4, 3), 150, seed=s), 16) for s in (20, 21)], 0.9)
    sm = S.size_matched_support(r1, wise)
    assert torch.equal(sm.sum(-1), wise.sum(-1))
    assert not (sm & ~S.causal_block_mask(10)).any()
    # Kept blocks are the top ones: every kept mass >= every dropped causal mass in the row.
    causal = S.causal_block_mask(10)
    min_kept = torch.where(sm, r1, torch.inf).amin(-1)
    max_dropped = torch.where(~sm & causal, r1, -torch.inf).amax(-1)
    assert (min_kept >= max_dropped).all()


def test_size_matched_ties_go_to_lower_index():
    mass1 = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0.2, 0.4, 0.4]])
    wise = torch.tensor([[1, 0, 0], [0, 1, 0], [1, 0, 1]], dtype=torch.bool)
    assert S.size_matched_support(mass1, wise).tolist() == [
        [True, False, False],
        [True, False, False],
        [False, True, True],
    ]


def test_density_and_block_count():
    layout = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.bool)
    assert S.density(layout) == pytest.approx(4 / 6)
    assert S.block_count(layout).tolist() == [1, 2, 1]
    assert S.block_count(layout, per_row=False) == 4
    both = torch.stack([layout, S.causal_block_mask(3)])
    assert S.density(both) == pytest.approx(10 / 12)


def test_retained_mass_weights_partial_last_block():
    # n = 5, B = 2: rows weigh 2, 2, 1. Kept mass per block row: 1.0, 0.7, 0.3 + 0.3.
    layout = torch.tensor([[1, 0, 0], [0, 1, 0], [1, 0, 1]], dtype=torch.bool)
    expect = (2 * 1.0 + 2 * 0.7 + 1 * 0.6) / 5
    assert S.retained_mass(MASS5, layout, 5, block_size=2) == pytest.approx(expect)
    # Token-level check: mass kept per token row, averaged over the 5 tokens.
    tok_keep = torch.tensor([1.0, 1.0, 0.6, 0.8, 0.3 + 0.3])
    assert S.retained_mass(MASS5, layout, 5, 2) == pytest.approx(float(tok_keep.mean()))
    full = S.causal_block_mask(3)
    assert S.retained_mass(MASS5, full, 5, 2) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="block_size=4 gives 2"):
        S.retained_mass(MASS5, layout, 5, block_size=4)


def test_retained_mass_takes_the_block_size_it_is_given():
    # n = 9, M = 3 fits B = 3 (rows 3, 3, 3) and B = 4 (rows 4, 4, 1): a size guessed from n and M
    # (the power of two, 4) weighed a B = 3 layout's rows wrongly.
    attn = _random_attn((2,), 9, seed=3)
    r = S.block_mass(attn, 3)
    layout = S.mass_support(r, 0.7)
    tok = layout.repeat_interleave(3, -2).repeat_interleave(3, -1)
    want = float((attn * tok).sum(-1).mean())
    assert S.retained_mass(r, layout, 9, block_size=3) == pytest.approx(want, abs=1e-6)
    assert S.retained_mass(r, layout, 9, block_size=4) != pytest.approx(want, abs=1e-6)
    with pytest.raises(TypeError):
        S.retained_mass(r, layout, 9)  # no default: every caller knows B


def test_retained_mass_leading_dims_and_block_size_inference():
    attn = _random_attn((2, 3), 100, seed=9)
    r = S.block_mass(attn, 32)  # M = 4, rows 32, 32, 32, 4
    layout = S.mass_support(r, 0.8)
    per = S.retained_mass(r, layout, 100, block_size=32, reduce=False)
    assert per.shape == (2, 3)
    # Token-level reference: expand the block layout to tokens and sum attention inside it.
    tok = layout.repeat_interleave(32, -2).repeat_interleave(32, -1)[..., :100, :100]
    ref = (attn * tok).sum(-1).mean(-1)
    torch.testing.assert_close(per, ref, atol=1e-5, rtol=0)
    assert S.retained_mass(r, layout, 100, 32) == pytest.approx(float(ref.mean()), abs=1e-5)


def test_pack_unpack_roundtrip():
    g = torch.Generator().manual_seed(0)
    layout = torch.rand(2, 3, 5, 5, generator=g) > 0.5
    packed = S.pack_layout(layout)
    assert packed.dtype == np.uint8 and packed.size == math.ceil(layout.numel() / 8)
    assert torch.equal(S.unpack_layout(packed, layout.shape), layout)
    assert torch.equal(S.unpack_layout(packed.tobytes(), layout.shape), layout)


def test_attention_block_mass_matches_dense_softmax_with_gqa():
    g = torch.Generator().manual_seed(4)
    H, Hkv, n, d = 6, 2, 37, 8
    q = torch.randn(H, n, d, generator=g)
    k = torch.randn(Hkv, n, d, generator=g)
    kk = k.repeat_interleave(H // Hkv, dim=0)
    scores = q @ kk.transpose(-1, -2) / math.sqrt(d)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    dense = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)
    want = _naive_block_mass(dense, 8).float()
    for chunk in (1, 4, None):
        got = S.attention_block_mass(q, k, 8, head_chunk=chunk, kv_repeat=3)
        assert got.shape == (H, 5, 5)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    with pytest.raises(ValueError):
        S.attention_block_mass(q, k, 8, kv_repeat=2)


def test_tie_order_on_wide_uniform_rows():
    # Every causal block of a 48-block row holds equal mass; reaching half the row must take the
    # lowest-index half, and size-matching K blocks must take blocks 0..K-1.
    M = 48
    causal = S.causal_block_mask(M)
    mass = causal.float() / causal.float().sum(-1, keepdim=True)
    sup = S.mass_support(mass, 0.5)
    assert sup[M - 1].nonzero().flatten().tolist() == list(range(24))
    assert sup[9].nonzero().flatten().tolist() == list(range(5))
    wise = torch.zeros(M, M, dtype=torch.bool)
    wise[:, 0] = True
    wise[M - 1, M - 8 :] = True  # 8 + 1 WISE blocks in the last row
    sm = S.size_matched_support(mass, wise)
    assert sm[M - 1].nonzero().flatten().tolist() == list(range(9))


def test_eta_one_keeps_tiny_positive_blocks():
    # A block holding 1e-9 of the row is still part of "all of the mass".
    mass = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 - 1e-9, 1e-9, 0.0]])
    assert S.mass_support(mass.double(), 1.0)[2].tolist() == [True, True, False]
    assert S.mass_support(mass.double(), 0.99)[2].tolist() == [True, False, False]
