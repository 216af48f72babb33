"""Decoding on static buffers (wise.engine.graph_decode): the same tokens and log-probabilities as
``extend`` pass by pass, eagerly on the CPU and as replayed CUDA graphs on a GPU, and cached Full
still equal to rerun Full on the graph path; the same for a ``wise.looped`` retrofit (its prelude and
coda through the plain-layer seam, its loop memory in the state)."""
import pytest
import torch

import wise.engine.graph_decode
from wise.analysis.calibration import CONDITIONS
from wise.engine.decoding import evaluate_example, evaluate_examples
from wise.models import RecurrentConfig, RecurrentDepthModel, init_weights
from wise.engine.runner import PAPER_SETTINGS, WiseSettings
from tiny_retrofits import open_lma  # noqa: E402

SETTINGS = PAPER_SETTINGS.replace(steps=8, discovery_step=4, window=2, block_size=16, eta=0.6)


def tiny(device="cpu"):
    cfg = RecurrentConfig.from_name("tiny-random").replace(mean_recurrence=8)
    return init_weights(RecurrentDepthModel(cfg), seed=0).eval().to(device)


def tiny_looped(device="cpu"):
    return open_lma(device, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=16)


MODELS = {"own": tiny, "looped": tiny_looped}


def ids_of(n, seed=0):
    return torch.randint(3, 2048, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# prompts of one length (decoded as one batch, answers of two lengths) and one of another; 47
# tokens + 5 new ones cross a block boundary, so rows of a new query block discover their own
EXAMPLES = [(ids_of(47, 1), ids_of(3, 11), 5), (ids_of(47, 2), ids_of(2, 12), 6), (ids_of(30, 3), ids_of(3, 13), 7)]


def assert_same(a, b, tol):
    for ra, rb in zip(a, b):
        for c in CONDITIONS:
            assert ra[c].tokens == rb[c].tokens, c
            assert len(ra[c].tokens) == 6
            assert ra[c].token_logprobs == pytest.approx(rb[c].token_logprobs, abs=tol), c
            assert ra[c].gold_logprob == rb[c].gold_logprob  # gold rows take the extend path in both


def test_static_buffers_give_the_numbers_of_extend():
    model = tiny()
    static = evaluate_examples(model, EXAMPLES, CONDITIONS, SETTINGS, 6, set(), "cached", graphs=True)
    plain = evaluate_examples(model, EXAMPLES, CONDITIONS, SETTINGS, 6, set(), "cached", graphs=False)
    assert_same(static, plain, 1e-5)


def test_a_looped_retrofit_decodes_on_static_buffers_with_the_numbers_of_extend():
    model = tiny_looped()
    made = []
    orig = wise.engine.graph_decode.StaticDecoder.__init__

    def init(self, *args, **kwargs):
        made.append(self)
        orig(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(wise.engine.graph_decode.StaticDecoder, "__init__", init)
        static = evaluate_examples(model, EXAMPLES, CONDITIONS, SETTINGS, 6, set(), "cached", graphs=True)
    assert made and all(not d.own and d.n_prelude == 1 and d.n_coda == 1 for d in made)
    plain = evaluate_examples(model, EXAMPLES, CONDITIONS, SETTINGS, 6, set(), "cached", graphs=False)
    assert_same(static, plain, 1e-5)


def test_static_decoder_refuses_more_passes_than_it_holds():
    model = tiny()
    runs = []
    orig = wise.engine.graph_decode.StaticDecoder.step

    def step(self, tokens=None):
        runs.append(self)
        return orig(self, tokens)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(wise.engine.graph_decode.StaticDecoder, "step", step)
        evaluate_example(model, EXAMPLES[0][0], EXAMPLES[0][1], ["full"], SETTINGS, 5, 3, set(), "cached", graphs=True)
    dec = runs[-1]
    assert dec.passes == dec.C == 2
    with pytest.raises(ValueError, match="holds 2 passes"):
        dec.step()


@pytest.mark.gpu
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_graph_replays_give_the_numbers_of_extend_and_of_rerun(kind):
    model = MODELS[kind]("cuda")
    captured = []
    orig = wise.engine.graph_decode.StaticDecoder._capture

    def capture(self, side):
        out = orig(self, side)
        captured.append(out is not None)
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(wise.engine.graph_decode.StaticDecoder, "_capture", capture)
        graphs = evaluate_examples(model, EXAMPLES, CONDITIONS, SETTINGS, 6, set(), "cached", graphs=True)
    # every row group's passes were replayed graphs
    assert captured and all(captured), wise.engine.graph_decode.StaticDecoder.capture_errors
    plain = evaluate_examples(model, EXAMPLES, CONDITIONS, SETTINGS, 6, set(), "cached", graphs=False)
    assert_same(graphs, plain, 1e-4)
    for (prompt, answer, seed), runs in zip(EXAMPLES, graphs):  # cached Full = rerun Full on the graph path
        rerun = evaluate_example(model, prompt, answer, ["full", "truncate"], SETTINGS, seed, 6, set(), "rerun")
        for c in ("full", "truncate"):
            assert runs[c].tokens == rerun[c].tokens
            assert runs[c].token_logprobs == pytest.approx(rerun[c].token_logprobs, abs=1e-4)


@pytest.mark.gpu
def test_once_warm_every_pass_of_a_row_group_is_a_replay():
    """After the first decoder of the process, a row group captures before its first pass instead of
    running it eagerly: no pass runs outside a capture, and the numbers are still extend's."""
    model = tiny("cuda")
    evaluate_examples(model, EXAMPLES[:1], ["full"], SETTINGS, 6, set(), "cached", graphs=True)  # warms
    capturing = []
    orig = wise.engine.graph_decode.StaticDecoder._early

    def early(self):
        capturing.append(torch.cuda.is_current_stream_capturing())
        return orig(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(wise.engine.graph_decode.StaticDecoder, "_early", early)
        graphs = evaluate_examples(model, EXAMPLES, CONDITIONS, SETTINGS, 6, set(), "cached", graphs=True)
    assert capturing and all(capturing)
    plain = evaluate_examples(model, EXAMPLES, CONDITIONS, SETTINGS, 6, set(), "cached", graphs=False)
    assert_same(graphs, plain, 1e-4)
