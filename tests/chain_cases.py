"""Shared by the calibration-model tests: synthchain prompts at a context budget with their parsed
layouts, and the answers the conditions stage's engine gives them, compared with the construction's
expected outcome (wise.analysis.calibration)."""
import torch

from wise.analysis.calibration import CONDITIONS, expected_outcome, parse_layout
from wise.data import build_cohort_variants, format_prompt, load_examples
from wise.data.synthchain import build_tokenizer
from wise.engine.decoding import evaluate_examples
from wise.engine.runner import WiseSettings, run_condition, state_seed

TOK = build_tokenizer()
FOLLOW = {"follow_hops": 16}  # two-token answers, as the default run asks them


def prompts(n: int, budget: int, seed: int = 11, **options):
    """n synthchain test questions as (example, token ids from BOS, parsed layout) at a context budget."""
    def count(text):
        return 1 + len(TOK.encode(text, add_special_tokens=False).ids)

    examples = load_examples("synthchain", "test", n, seed, **(options or FOLLOW))
    out = []
    for ex, cv in zip(examples, build_cohort_variants(examples, [budget], count, seed)):
        ids = [0] + TOK.encode(format_prompt(cv.variants[budget]), add_special_tokens=False).ids
        out.append((ex, ids, parse_layout([TOK.id_to_token(i) for i in ids])))
    return out


def settings_of(w: WiseSettings) -> WiseSettings:
    return WiseSettings(w.steps, w.discovery_step, w.window, w.block_size, w.eta, w.backend)


def engine_answers(model, cases, conditions, settings: WiseSettings) -> list[dict[str, str]]:
    """The conditions stage's path: every case and condition in one cached, batched call."""
    examples = [(ids, TOK.encode(ex.answers[0], add_special_tokens=False).ids, state_seed(ex.example_id, 0))
                for ex, ids, _ in cases]
    runs = evaluate_examples(model, examples, list(conditions), settings, 3, {1})
    return [{c: " ".join(TOK.id_to_token(i) for i in r[c].tokens) for c in conditions} for r in runs]


def mismatches(model, cases, settings: WiseSettings, conditions=CONDITIONS):
    s = settings_of(settings)
    out = []
    for (ex, _, lay), got in zip(cases, engine_answers(model, cases, conditions, settings)):
        out += [(ex.example_id, c) for c in conditions
                if (got[c] == ex.answers[0]) != expected_outcome(lay, c, s).correct]
    return out


def first_token(model, ex, ids, condition, settings):
    res = run_condition(model, torch.tensor(ids), condition, settings, state_seed(ex.example_id, 0))
    return TOK.id_to_token(int(res.logits[-1].argmax()))
