"""Training the backbone: batches, truncated backprop, a few deterministic steps that learn."""
import numpy as np
import pytest
import torch

from wise.data.tokenizer import EOS_ID, PAD_ID, load_tokenizer
from wise.models import RecurrentConfig, load_checkpoint
from wise.training.batches import IGNORE, batch_budget, make_batch, training_stream
from wise.training.config import TrainConfig
from wise.training.loop import batch_loss, build_model, make_optimizer, recurrent_forward, sample_recurrence, train

TOKENIZER = "data/models/wise-tiny-random"  # vocab 2048, matches the tiny-random preset

CFG = TrainConfig(preset="tiny-random", context_lengths=(256, 512), context_weights=(1.0, 1.0),
                  short_steps=2, short_context=256, tokens_per_batch=1024, recurrence_mean=4,
                  recurrence_max=8, recurrence_ramp_steps=0, backprop_steps=2, warmup_steps=1,
                  lr=3e-3, data_workers=0, log_every=1, tokenizer_examples=16, extra_questions=0,
                  extra_reserve=0, eval_every=0, time_limit_s=0)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(TOKENIZER)


def test_batches_are_deterministic_and_mark_the_answer(tok):
    a, b = make_batch(CFG, tok, 3), make_batch(CFG, tok, 3)
    assert np.array_equal(a.ids, b.ids) and np.array_equal(a.is_answer, b.is_answer)
    assert not np.array_equal(make_batch(CFG, tok, 4).ids[:1, :50], a.ids[:1, :50]) or a.budget != 256
    assert a.ids.shape[1] <= a.budget
    for row in range(a.ids.shape[0]):
        answer = a.targets[row][a.is_answer[row]]
        assert answer[-1] == EOS_ID  # answer tokens, then EOS
        text = tok.decode(answer[:-1].tolist())
        prompt = tok.decode(a.ids[row][a.ids[row] != PAD_ID].tolist())
        assert prompt.rstrip().endswith("Answer:" + text)
        assert (a.targets[row][a.ids[row] == PAD_ID] == IGNORE).all()
    assert {batch_budget(CFG, i) for i in range(2)} == {256}  # curriculum: short budgets first


def _runs(mask):
    """[start, end) of each run of True in a 1-d bool array."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)))


def test_extra_questions_are_scored_like_the_main_answer(tok):
    cfg = CFG.replace(extra_questions=3, extra_reserve=96)
    batch = make_batch(cfg, tok, 5)
    assert batch.ids.shape[1] <= batch.budget
    counts = []
    for row in range(batch.ids.shape[0]):
        spans = _runs(batch.is_answer[row])
        counts.append(len(spans))
        assert 1 <= len(spans) <= 4
        for start, end in spans:
            # position j predicts token j + 1: the span's targets are the answer and its EOS,
            # and the tokens read up to the span's first position end with "Answer:".
            assert batch.targets[row][end - 1] == EOS_ID
            assert tok.decode(batch.ids[row][:start + 1].tolist()).endswith("Answer:")
    assert max(counts) > 1  # extras were added
    plain = make_batch(CFG.replace(extra_reserve=96), tok, 5)
    assert all(len(_runs(plain.is_answer[r])) == 1 for r in range(plain.ids.shape[0]))


def test_batch_stream_workers_match_in_process(tok):
    with training_stream(CFG, TOKENIZER, workers=0) as s0, training_stream(CFG, TOKENIZER, workers=2) as s2:
        for _ in range(3):
            x, y = next(s0), next(s2)
            assert x.index == y.index and np.array_equal(x.ids, y.ids)


def test_recurrence_samples_are_seeded_and_bounded():
    cfg = CFG.replace(recurrence_mean=24, recurrence_max=64, recurrence_ramp_steps=100)
    draws = [sample_recurrence(cfg, i) for i in range(100, 400)]
    assert draws == [sample_recurrence(cfg, i) for i in range(100, 400)]
    assert 1 <= min(draws) and max(draws) <= 64 and 18 < np.mean(draws) < 30
    assert np.mean([sample_recurrence(cfg, i) for i in range(0, 20)]) < 12  # ramped mean early


class GradSteps:
    def __init__(self):
        self.with_grad = []

    def on_attention(self, *args):
        pass

    def on_state(self, step, state):
        self.with_grad.append((step, state.requires_grad))


@pytest.mark.parametrize("num_steps,k", [(7, 3), (2, 3)])
def test_truncated_backprop_builds_a_graph_only_through_the_last_k_steps(num_steps, k):
    model = build_model(CFG)
    ids = torch.randint(3, 2048, (2, 24), generator=torch.Generator().manual_seed(0))
    obs = GradSteps()
    logits = recurrent_forward(model, ids, num_steps, k, torch.Generator().manual_seed(0), obs)
    assert [s for s, _ in obs.with_grad] == list(range(1, num_steps + 1))
    graded = [s for s, g in obs.with_grad if g]
    assert graded == list(range(max(1, num_steps - k + 1), num_steps + 1))
    logits.sum().backward()  # and the graph is usable
    assert model.transformer.adapter.weight.grad is not None


def _fit_fixed_batch(batch, steps=6):
    torch.manual_seed(0)
    model = build_model(CFG)
    opt = make_optimizer(model, CFG, torch.device("cpu"))
    ids, targets, is_answer = (torch.from_numpy(x) for x in (batch.ids, batch.targets, batch.is_answer))
    losses = []
    for i in range(steps):
        logits = recurrent_forward(model, ids, 3, 2, torch.Generator().manual_seed(i))
        loss, _, _ = batch_loss(logits, targets, is_answer, 0.1)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_a_few_steps_reduce_the_loss_on_a_fixed_batch_deterministically(tok):
    batch = make_batch(CFG, tok, 0)
    a = _fit_fixed_batch(batch)
    assert a[-1] < a[0] - 0.3
    assert a == _fit_fixed_batch(batch)


def test_train_writes_a_loadable_checkpoint_with_tokenizer_and_loss_curve(tmp_path):
    summary = train(CFG.replace(max_steps=2), tmp_path, device="cpu", workers=0, progress=False)
    assert summary["steps"] == 2 and summary["stopped_by"] == "max_steps"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "loss_curve.csv"):
        assert (tmp_path / name).is_file()
    assert (tmp_path / "loss_curve.csv").read_text().startswith("step,tokens,loss,answer_loss")
    model = load_checkpoint(str(tmp_path))
    assert model.config.name == "tiny-random"


def test_bad_params_name_the_key():
    with pytest.raises(ValueError, match="train.context_weights"):
        TrainConfig(context_lengths=(256, 512), context_weights=(1.0,))
    with pytest.raises(ValueError, match="train.bogus"):
        TrainConfig.from_dict({"bogus": 1})


def test_evidence_only_curriculum_drops_the_distractors_then_mixes(tok):
    cfg = CFG.replace(benchmarks={"synthhop": 1.0}, evidence_only_steps=2, evidence_only_frac=0.0)
    early, late = make_batch(cfg, tok, 1), make_batch(cfg, tok, 2)
    assert np.array_equal(late.ids, make_batch(CFG.replace(benchmarks={"synthhop": 1.0}), tok, 2).ids)
    # evidence-only rows are shorter than the full-budget rows of the same batch index
    full = make_batch(CFG.replace(benchmarks={"synthhop": 1.0}), tok, 1)
    assert (early.ids != PAD_ID).sum() < (full.ids != PAD_ID).sum()
    for row in range(early.ids.shape[0]):  # the answer is still marked right after the prompt
        answer = early.targets[row][early.is_answer[row]]
        assert answer[-1] == EOS_ID
        prompt = tok.decode(early.ids[row][early.ids[row] != PAD_ID].tolist())
        assert prompt.rstrip().endswith("Answer:" + tok.decode(answer[:-1].tolist()))
    mixed = CFG.replace(evidence_only_frac=0.5)
    assert np.array_equal(make_batch(mixed, tok, 5).ids, make_batch(mixed, tok, 5).ids)
    with pytest.raises(ValueError, match="train.evidence_only_frac"):
        CFG.replace(evidence_only_frac=1.5)



def test_batch_loss_is_the_mean_over_each_target_set():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=gen)
    targets = torch.randint(0, 11, (2, 5), generator=gen)
    targets[0, :2] = IGNORE
    is_answer = torch.zeros(2, 5, dtype=torch.bool)
    is_answer[1, 3:] = True
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE,
                                           reduction="none").view(2, 5)
    total, answer, lm = batch_loss(logits, targets, is_answer, 0.5)
    lm_set = (targets != IGNORE) & ~is_answer
    assert torch.allclose(answer, ce[is_answer].mean()) and torch.allclose(lm, ce[lm_set].mean())
    assert torch.allclose(total, answer + 0.5 * lm)
    # no prompt-text targets at all: the lm term is 0, not NaN
    only_answers = torch.where(is_answer, targets, torch.full_like(targets, IGNORE))
    total, answer, lm = batch_loss(logits, only_answers, is_answer, 0.5)
    assert lm.item() == 0.0 and torch.allclose(total, ce[is_answer].mean())


def test_train_model_overrides_change_the_architecture_and_are_validated():
    config = TrainConfig.from_dict({**CFG.to_dict(), "model": {"n_core": 3, "intermediate": 128}})
    arch = config.architecture()
    assert (arch.n_core, arch.intermediate) == (3, 128) and arch.name.endswith("-custom")
    model = build_model(config)
    assert len(model.transformer.core_block) == 3 != RecurrentConfig.from_name(CFG.preset).n_core
    assert TrainConfig.from_dict(config.to_dict()) == config  # survives train_recipe.json
    with pytest.raises(ValueError, match=r"train\.model .*unknown: \['n_cores'\]"):
        CFG.replace(model={"n_cores": 2})
    with pytest.raises(ValueError, match=r"train\.model .*n_core"):
        CFG.replace(model={"n_core": 0})
    with pytest.raises(ValueError, match=r"train\.context_lengths .*positions"):
        CFG.replace(model={"max_positions": 128})


def test_prompt_style_writes_rows_and_is_validated(tok):
    """train.prompt_style: every row's prompt is written in that style (budgets count it), the
    answer spans still follow the prompt, and an unknown style names the key."""
    first = make_batch(CFG.replace(prompt_style="question_first"), tok, 3)
    plain = make_batch(CFG, tok, 3)
    assert first.budget == plain.budget and first.ids.shape[1] <= first.budget
    for row in range(first.ids.shape[0]):
        ids = first.ids[row][first.ids[row] != PAD_ID].tolist()
        text = tok.decode(ids[1:])
        question = text.split("\n\n", 1)[0]
        assert question.startswith("Question: ") and text.count(question) >= 2
        answer = first.targets[row][first.is_answer[row]]
        assert answer[-1] == EOS_ID
    with pytest.raises(ValueError, match="train.prompt_style"):
        CFG.replace(prompt_style="question_last")
