"""A new row's own late support (``wise.engine.appended_rows.own_blocks``), computed on the row alone,
equals row q_i of the support rules applied to a prompt's square of masses (the construction that puts
each row's masses in row q_i of an M x M square), bit for bit, for every support condition."""
import pytest
import torch

from wise.engine.appended_rows import own_blocks
from wise.engine.conditions import SUPPORT_RULES, DiscoveryMasses, condition_support, discovery_steps
from wise.engine.runner import PAPER_SETTINGS

SETTINGS = PAPER_SETTINGS.replace(steps=8, discovery_step=4, window=3, block_size=4, eta=0.9)


def square_rows(condition, masses, settings, start):
    """The square construction: row i's masses [L, R, H, r, M] into row q_i of [L*R*r, H, M, M], the
    prompt's rule on the square, row q_i read back -> [L, R, H, r, M]."""
    L, R, H, r, M = masses[1].shape
    q = torch.div(torch.arange(start, start + r), settings.block_size, rounding_mode="floor")
    idx = q.view(1, 1, r, 1, 1, 1).expand(L, R, r, H, 1, M)

    def square(m):
        sq = torch.zeros(L, R, r, H, M, M)
        sq.scatter_(4, idx, m.float().permute(0, 1, 3, 2, 4).unsqueeze(4))
        return sq.reshape(L * R * r, H, M, M)

    d = DiscoveryMasses(step1=square(masses[1]),
                        window=[square(masses[t]) for t in discovery_steps(settings.discovery_step, settings.window)])
    layout = condition_support(condition, d, settings.eta).reshape(L, R, r, H, M, M)
    return layout.gather(4, idx).squeeze(4).permute(0, 1, 3, 2, 4)


def random_masses(shape, start, block_size, g, ties: bool):
    """fp16 block masses [L, R, H, r, M] of rows that attend causally (zero past each row's block), each
    row summing to ~1; with ties, masses on a coarse grid so that equal masses (and zero rows) occur."""
    *_, r, M = shape
    raw = torch.rand(shape, generator=g) ** 4
    if ties:
        raw = torch.floor(raw * 4) / 4
    q = torch.div(torch.arange(start, start + r), block_size, rounding_mode="floor")
    raw = raw * (torch.arange(M)[None, :] <= q[:, None])
    return (raw / raw.sum(-1, keepdim=True).clamp_min(1e-6)).to(torch.float16)


CASES = [(1, 0), (1, 7), (1, 8), (1, 37), (3, 5), (3, 12), (5, 30), (5, 33)]  # (r, start): blocks of 4


@pytest.mark.parametrize("condition", list(SUPPORT_RULES))
@pytest.mark.parametrize("ties", [False, True])
def test_own_blocks_equal_the_square_construction(condition, ties):
    g = torch.Generator().manual_seed(5)
    for r, start in CASES:
        M = -(-(start + r) // SETTINGS.block_size)
        shape = (2, 3, 5, r, M)  # L, R, H, r, M
        masses = {t: random_masses(shape, start, SETTINGS.block_size, g, ties)
                  for t in {1, *discovery_steps(SETTINGS.discovery_step, SETTINGS.window)}}
        got = own_blocks(condition, masses, SETTINGS, start)
        want = square_rows(condition, masses, SETTINGS, start)
        assert got.shape == want.shape == shape and got.dtype == torch.bool
        assert torch.equal(got, want), (condition, r, start)
        q = torch.div(torch.arange(start, start + r), SETTINGS.block_size, rounding_mode="floor")
        assert not (got & (torch.arange(M)[None, :] > q[:, None])).any()  # never past the row's own block
        assert got.any(-1).all()  # never an empty row


def test_own_blocks_take_masses_past_the_row_as_outside_its_support():
    """Masses in key blocks after a row's own block (which causal attention never gives) are ignored
    by both constructions alike."""
    g = torch.Generator().manual_seed(6)
    start, r = 9, 3
    M = -(-(start + r) // SETTINGS.block_size) + 2
    masses = {t: torch.rand(1, 2, 3, r, M, generator=g).to(torch.float16)
              for t in {1, *discovery_steps(SETTINGS.discovery_step, SETTINGS.window)}}
    for condition in SUPPORT_RULES:
        got = own_blocks(condition, masses, SETTINGS, start)
        assert torch.equal(got, square_rows(condition, masses, SETTINGS, start)), condition
        assert not got[..., 3:].any(), condition


@pytest.mark.gpu
def test_own_blocks_on_cuda_equal_the_square_construction_on_the_cpu():
    """The decoders build supports where the masses live: on CUDA, a row after a 4K prompt (M 129)."""
    g = torch.Generator().manual_seed(7)
    start, r = 4096 + 16, 1
    M = -(-(start + r) // PAPER_SETTINGS.block_size)
    masses = {t: random_masses((2, 2, 8, r, M), start, PAPER_SETTINGS.block_size, g, False)
              for t in {1, *discovery_steps(PAPER_SETTINGS.discovery_step, PAPER_SETTINGS.window)}}
    on_gpu = {t: m.cuda() for t, m in masses.items()}
    for condition in SUPPORT_RULES:
        got = own_blocks(condition, on_gpu, PAPER_SETTINGS, start)
        assert got.is_cuda
        assert torch.equal(got.cpu(), square_rows(condition, masses, PAPER_SETTINGS, start)), condition


def test_rows_record_the_steps_their_conditions_read():
    from wise.engine.conditions import recorded_steps

    assert recorded_steps(["full", "wise"], 12, 3) == {10, 11, 12}  # WISE alone: the window, not step 1
    assert recorded_steps(["full", "freeze_a"], 4, 2) == {3, 4}
    for control in ("static95", "mass_matched", "size_matched"):
        assert recorded_steps(["wise", control], 4, 2) == {1, 3, 4}
    assert recorded_steps(["full", "truncate"], 4, 2) == set()
    assert recorded_steps(["wise"], 2, 2) == {1, 2}  # a window that starts at step 1
    g = torch.Generator().manual_seed(8)
    start, r = 9, 3
    shape = (2, 3, 5, r, -(-(start + r) // SETTINGS.block_size))
    window = discovery_steps(SETTINGS.discovery_step, SETTINGS.window)
    masses = {t: random_masses(shape, start, SETTINGS.block_size, g, False) for t in {1, *window}}
    for condition in ("wise", "freeze_a"):  # the window's masses alone give the same support
        alone = own_blocks(condition, {t: masses[t] for t in window}, SETTINGS, start)
        assert torch.equal(alone, own_blocks(condition, masses, SETTINGS, start)), condition


def test_decoding_that_skips_step_1_gives_the_numbers_of_recording_it(monkeypatch):
    """Full and WISE rows record only WISE's window now; their tokens and log-probabilities equal a
    decode that records step 1 as well (extend and the static buffers alike)."""
    import wise.engine.extension as extension
    from test_graph_decode import EXAMPLES, tiny
    from wise.engine.decoding import evaluate_examples

    settings = SETTINGS.replace(block_size=16, eta=0.6)
    model, seen, original = tiny(), [], extension.recorded_steps

    def record(conditions, t_d, w, extra=()):
        seen.append(original(conditions, t_d, w) | set(extra))
        return seen[-1]

    runs = []
    for extra in ((), (1,)):
        monkeypatch.setattr(extension, "recorded_steps", lambda c, t_d, w, extra=extra: record(c, t_d, w, extra))
        for graphs in (False, True):
            runs.append(evaluate_examples(model, EXAMPLES, ["full", "wise"], settings, 6, set(), "cached",
                                          graphs=graphs))
    window = set(discovery_steps(settings.discovery_step, settings.window))
    assert window and 1 not in window and seen and {frozenset(s) for s in seen} == {frozenset(window),
                                                                                      frozenset(window | {1})}
    for a, b in ((runs[0], runs[2]), (runs[1], runs[3])):
        for ra, rb in zip(a, b):
            for c in ("full", "wise"):
                assert ra[c].tokens == rb[c].tokens and ra[c].token_logprobs == rb[c].token_logprobs, c
                assert ra[c].gold_logprob == rb[c].gold_logprob, c
