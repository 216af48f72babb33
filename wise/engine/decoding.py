"""The generation engine: every condition of one example — its greedy answer and the teacher-forced
log-probability of the gold answer — from one shared prefix.

    runs = evaluate_example(model, prompt_ids, answer_ids, conditions, settings, seed,
                            max_new_tokens=8, stop_ids={eos}, generation="cached")

Steps 1..t_d of the prompt run once (``wise.engine.runner.run_prefix``) and every condition forks its late
steps from there. Two ways to continue a sequence (``conditions.generation``):

* ``rerun`` (the paper's): each new token re-runs the whole recurrence over prompt + prefix; the
  late support is rediscovered on the sequence being processed. Conditions whose sequences are
  equal share each pass's prefix.
* ``cached``: the prompt runs once; the keys and values of every (step, core layer), of the prelude
  and of the coda are kept, and a new token runs its layers on its own row against them (the
  project's models directly, ``wise.looped``'s through its plain-layer seam). A new row's late
  support is defined in ``wise.engine.appended_rows``: its block's row of the
  prompt's support unioned with what its own query row discovers. Truncate runs the new row's
  first t_d steps.

With an exit criterion (``WiseSettings.exit_criterion``, ``wise.engine.exit_criteria``; cached only) each
generated token stops its recurrence where the criterion fires (``wise.engine.extension.extend_exiting``)
and ``ConditionRun.token_steps`` records the steps behind each token. An empty gold answer (generation
only) gives a NaN ``gold_logprob``.

Because a row's initial state depends only on (example, position), the prompt's states are the same
in every pass, so cached Full equals rerun Full up to floating-point summation order.

In cached mode the (example, condition) rows of examples whose prompts have one length run as one
batch (``evaluate_examples``; ``wise.engine.runner.run_late_rows``, ``wise.engine.appended_rows.RowGroup``): their
late steps, the gold answers' rows and every generated token go through each layer's dense work
once for all rows, each row attending through its own condition; a batch is split (by examples,
then by conditions) when its caches would not fit in half the free GPU memory. Rows whose answer
has ended ride along, their outputs unused, until the last row of the batch stops.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from wise.engine.adaptive_decoding import adaptive_settings, run_adaptive_prefix
from wise.engine.appended_rows import SUPPORT_FREE, RowGroup, Tails, last_row
from wise.engine.conditions import ADAPTIVE
from wise.engine.decode_memory import condition_groups, example_chunks
from wise.engine.extension import extend, extend_exiting
from wise.engine.graph_decode import StaticDecoder
from wise.engine.runner import Prefix, WiseSettings, run_late, run_late_rows, run_prefix

GENERATION_MODES = ("cached", "rerun")


@dataclass
class ConditionRun:
    condition: str
    tokens: list[int]  # greedy continuation, stop token excluded
    gold_logprob: float  # mean log-probability of the gold answer tokens
    state_hash: str  # the state after t_d (the prompt pass)
    layouts: torch.Tensor | None  # the prompt's late support [L, H, M, M]
    # per generated token: its log-probability and its logit's lead over the runner-up (how far
    # the argmax is from flipping), so two paths' sequences can be compared token by token
    token_logprobs: list[float] = field(default_factory=list)
    token_margins: list[float] = field(default_factory=list)
    discovery_step: int | None = None  # the depth its late steps start after (None: settings.discovery_step)
    # with an exit criterion (settings.exit_criterion), per generated token: the recurrence steps of
    # the pass that produced it (the prompt's pass, T or t_d under Truncate, for the first; its exit
    # step for the others); empty without one
    token_steps: list[int] = field(default_factory=list)


def _choose(logits: torch.Tensor) -> list[tuple[int, float, float]]:
    """Greedy choice of each row of logits [R, vocab]: (token, its log-probability, top-1 minus
    top-2 logit), read back in one host transfer."""
    logits = logits.float()
    top = logits.topk(2, dim=-1)
    lse = torch.logsumexp(logits, dim=-1)
    stats = torch.stack([top.indices[:, 0].double(), (top.values[:, 0] - lse).double(),
                         (top.values[:, 0] - top.values[:, 1]).double()], dim=1).cpu().tolist()
    return [(int(t), lp, margin) for t, lp, margin in stats]


def _mean_logprob(logits: torch.Tensor, targets: list[int]) -> float:
    """Mean log-probability of `targets` under logits [len(targets), vocab]; NaN without targets
    (generation only: no gold answer given)."""
    if not targets:
        return math.nan
    logp = torch.log_softmax(logits.float(), dim=-1)
    return float(logp.gather(-1, torch.tensor(targets, device=logp.device)[:, None]).mean())


@dataclass(frozen=True)
class Example:
    prompt: list[int]
    answer: list[int]
    seed: int  # ``state_seed`` of the example


@torch.no_grad()
def evaluate_example(model, prompt_ids, answer_ids: list[int], conditions, settings: WiseSettings,
                     seed: int, max_new_tokens: int, stop_ids, generation: str = "cached",
                     share_prefix: bool = True, profile: dict | None = None,
                     graphs: bool | None = None) -> dict[str, ConditionRun]:
    """Every condition of one example (`seed` = ``state_seed`` of the example). share_prefix=False
    (rerun only) runs each condition's passes on their own, as separate runs would: the same
    numbers, more work (the benchmark's "today" path). `profile` (cached only) receives the seconds
    of the shared prefix ("prefix"), of each condition's fork (its share of its group's) and, as
    "<condition>:late", the part of the fork spent in the late steps over the prompt; the rest of the fork
    splits into "<condition>:gold" (the gold answer's rows), "<condition>:setup" (the row group and its
    static decoder) and "<condition>:passes" (decoding, graph captures included); whatever remains is the
    results' bookkeeping. `graphs` as for ``evaluate_examples``."""
    if generation not in GENERATION_MODES:
        raise ValueError(f"generation must be one of {GENERATION_MODES}, got {generation!r}")
    if generation == "cached" and not share_prefix:
        raise ValueError("cached decoding always shares the prompt's prefix")
    if generation == "rerun" and not share_prefix:
        _cached_only(settings, conditions)
        ex = _example(prompt_ids, answer_ids, seed, max_new_tokens)
        args = (model, ex.prompt, ex.answer)
        return {c: _rerun(*args, [c], settings, seed, max_new_tokens, set(stop_ids))[c] for c in conditions}
    return evaluate_examples(model, [(prompt_ids, answer_ids, seed)], conditions, settings, max_new_tokens,
                             stop_ids, generation, profile=profile, graphs=graphs)[0]


def _example(prompt_ids, answer_ids, seed, max_new_tokens) -> Example:
    """An empty answer (generation only) gives a NaN ``gold_logprob``."""
    if max_new_tokens < 1:
        raise ValueError("need max_new_tokens >= 1")
    prompt = [int(i) for i in (prompt_ids.tolist() if torch.is_tensor(prompt_ids) else prompt_ids)]
    return Example(prompt, [int(i) for i in answer_ids], int(seed))


@torch.no_grad()
def evaluate_examples(model, examples, conditions, settings: WiseSettings, max_new_tokens: int, stop_ids,
                      generation: str = "cached", profile: dict | None = None,
                      graphs: bool | None = None) -> list[dict[str, ConditionRun]]:
    """Every condition of several examples, each given as (prompt ids, answer ids, seed); results in
    their order. Cached: examples whose prompts have one length are decoded as one batch of
    (example, condition) rows; every example keeps its own prefix and initial state, so its
    numbers are those of a run on its own up to floating-point summation order. `profile` as for
    ``evaluate_example``, summed over the examples. `graphs` (cached): decode on static buffers
    replayed as CUDA graphs (``wise.engine.graph_decode``); None = wherever the device is CUDA and the
    model caches its prelude and coda (the project's architecture, ``wise.looped``'s retrofits), True =
    the static path also on the CPU (eagerly),
    False = ``wise.engine.extension.extend`` pass by pass."""
    if generation not in GENERATION_MODES:
        raise ValueError(f"generation must be one of {GENERATION_MODES}, got {generation!r}")
    exs = [_example(p, a, seed, max_new_tokens) for p, a, seed in examples]
    conds, stop = list(conditions), set(stop_ids)
    if generation == "rerun":
        _cached_only(settings, conds)
        return [_rerun(model, ex.prompt, ex.answer, conds, settings, ex.seed, max_new_tokens, stop) for ex in exs]
    out: list[dict | None] = [None] * len(exs)
    by_length: dict[int, list[int]] = {}
    for i, ex in enumerate(exs):
        by_length.setdefault(len(ex.prompt), []).append(i)
    for idx in by_length.values():
        # equal answer lengths next to each other: the gold rows of a run of them are one batch
        idx = sorted(idx, key=lambda i: len(exs[i].answer))
        for chunk in example_chunks(model, [len(exs[i].prompt) for i in idx], conds, settings):
            runs = _cached(model, [exs[idx[j]] for j in chunk], conds, settings, max_new_tokens, stop, profile,
                           graphs)
            for j, r in zip(chunk, runs):
                out[idx[j]] = r
    return out


def _cached_only(settings: WiseSettings, conds) -> None:
    if ADAPTIVE in conds:
        raise ValueError(f"{ADAPTIVE} runs only with cached generation")
    if settings.exit_criterion is not None:
        raise ValueError("exit criteria (settings.exit_criterion) run only with cached generation")


def _prefix(model, seq, conds, settings, seed, cache=False) -> Prefix:
    return run_prefix(model, torch.tensor(seq), settings, seed, record=any(c not in SUPPORT_FREE for c in conds),
                      keep_qk="freeze_a" in conds, cache=cache)


def _rerun(model, prompt, answer, conds, settings, seed, max_new, stop) -> dict[str, ConditionRun]:
    seqs = {c: list(prompt) for c in conds}
    tokens: dict[str, list[int]] = {c: [] for c in conds}
    stats: dict[str, list[tuple]] = {c: [] for c in conds}
    first: dict[str, tuple] = {}
    active = list(conds)
    for _ in range(max_new):
        groups: dict[tuple, list[str]] = {}
        for c in active:
            groups.setdefault(tuple(seqs[c]), []).append(c)
        active = []
        for seq, group in groups.items():
            prefix = _prefix(model, seq, group, settings, seed)
            for c in group:
                late = run_late(model, prefix, c, settings)
                first.setdefault(c, (prefix.state_hash, late.layouts))
                token, lp, margin = _choose(model.readout(late.state, prefix.rope,
                                                          at=last_row(len(seq), late.state.device)))[0]
                if token not in stop:
                    tokens[c].append(token)
                    stats[c].append((lp, margin))
                    seqs[c].append(token)
                    active.append(c)
    if not answer:  # generation only
        return {c: ConditionRun(c, tokens[c], math.nan, *first[c], [lp for lp, _ in stats[c]],
                                [m for _, m in stats[c]]) for c in conds}
    full = prompt + answer
    prefix = _prefix(model, full, conds, settings, seed)
    rows = (torch.zeros(len(answer), dtype=torch.long), torch.arange(len(prompt) - 1, len(full) - 1))
    out = {}
    for c in conds:
        late = run_late(model, prefix, c, settings)
        logits = model.readout(late.state, prefix.rope, at=tuple(r.to(late.state.device) for r in rows))
        out[c] = ConditionRun(c, tokens[c], _mean_logprob(logits, answer), *first[c],
                              [lp for lp, _ in stats[c]], [m for _, m in stats[c]])
    return out


def _clock(device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _cached(model, exs: list[Example], conds, settings, max_new, stop, profile=None,
            graphs: bool | None = None) -> list[dict[str, ConditionRun]]:
    if ADAPTIVE in conds:  # its own dense prefix per example, to its own depth
        rest = [c for c in conds if c != ADAPTIVE]
        out = _cached(model, exs, rest, settings, max_new, stop, profile, graphs) if rest else [{} for _ in exs]
        for o, run in zip(out, _adaptive_runs(model, exs, settings, max_new, stop, profile, graphs)):
            o[ADAPTIVE] = run
        return [{c: o[c] for c in conds} for o in out]
    start = _clock(model.device) if profile is not None else 0.0
    prefixes = [_prefix(model, ex.prompt, conds, settings, ex.seed, cache=True) for ex in exs]
    if profile is not None:
        profile["prefix"] = profile.get("prefix", 0.0) + _clock(model.device) - start
    out: list[dict] = [{} for _ in exs]
    for group in condition_groups(model, prefixes[0].ids.shape[1], len(prefixes), conds, settings):
        start = _clock(model.device) if profile is not None else 0.0
        rows = [(j, c) for j in range(len(exs)) for c in group]
        if group == ["truncate"]:
            lates = [run_late(model, prefixes[j], "truncate", settings, cache=True) for j, _ in rows]
        elif model.device.type == "cuda":
            lates = run_late_rows(model, [(prefixes[j], c) for j, c in rows], settings, cache=True)
        else:  # several prompts' rows at once fall out of the CPU's caches (2x slower at 2048 tokens)
            lates = [late for j in range(len(exs))
                     for late in run_late_rows(model, [(prefixes[j], c) for c in group], settings, cache=True)]
        late_secs = (_clock(model.device) - start) / len(group) if profile is not None else 0.0
        made = _clock(model.device) if profile is not None else 0.0
        rg = RowGroup(model, settings, prefixes, lates, [j for j, _ in rows])
        parts = dict(setup=_clock(model.device) - made, gold=0.0, passes=0.0) if profile is not None else None
        tokens, stats, gold, steps = _decode(rg, [exs[j].answer for j, _ in rows], max_new, stop, graphs, parts)
        for i, ((j, c), late) in enumerate(zip(rows, lates)):
            out[j][c] = ConditionRun(c, tokens[i], _mean_logprob(gold[i], exs[j].answer), prefixes[j].state_hash,
                                     late.layouts, [lp for lp, _ in stats[i]], [m for _, m in stats[i]],
                                     token_steps=steps[i])
        if profile is not None:
            secs = (_clock(model.device) - start) / len(group)
            for c in group:
                profile[c] = profile.get(c, 0.0) + secs
                profile[f"{c}:late"] = profile.get(f"{c}:late", 0.0) + late_secs  # the late steps over the prompts
                for key in ("gold", "setup", "passes"):
                    profile[f"{c}:{key}"] = profile.get(f"{c}:{key}", 0.0) + parts[key] / len(group)
    return [{c: o[c] for c in conds} for o in out]


def _adaptive_runs(model, exs, settings: WiseSettings, max_new: int, stop, profile=None, graphs=None) -> list:
    """One ``ConditionRun`` of wise_adaptive per example (of one prompt length), with its t_a as
    ``discovery_step``: its own prefix to t_a (``wise.engine.adaptive_decoding``), then WISE's late steps
    and decoding with t_d = t_a, examples that settled at one step as one row group."""
    start = _clock(model.device) if profile is not None else 0.0
    found = [run_adaptive_prefix(model, torch.tensor(ex.prompt), settings, ex.seed, cache=True) for ex in exs]
    by_step: dict[int, list[int]] = {}
    for j, (_, t_a) in enumerate(found):
        by_step.setdefault(t_a, []).append(j)
    out: list = [None] * len(exs)
    late_secs = 0.0
    for t_a, idx in sorted(by_step.items()):
        s_t = adaptive_settings(settings, t_a)
        prefixes = [found[j][0] for j in idx]
        t0 = _clock(model.device) if profile is not None else 0.0
        if model.device.type == "cuda":
            lates = run_late_rows(model, [(p, "wise") for p in prefixes], s_t, cache=True)
        else:  # one prompt at a time on the CPU, as wise.engine.decoding does
            lates = [run_late_rows(model, [(p, "wise")], s_t, cache=True)[0] for p in prefixes]
        late_secs += (_clock(model.device) - t0) if profile is not None else 0.0
        rg = RowGroup(model, s_t, prefixes, lates, list(range(len(idx))))
        tokens, stats, gold, steps = _decode(rg, [exs[j].answer for j in idx], max_new, stop, graphs)
        for i, j in enumerate(idx):
            out[j] = ConditionRun(ADAPTIVE, tokens[i], _mean_logprob(gold[i], exs[j].answer), prefixes[i].state_hash,
                                  lates[i].layouts, [lp for lp, _ in stats[i]], [m for _, m in stats[i]],
                                  discovery_step=t_a, token_steps=steps[i])
    if profile is not None:
        profile[ADAPTIVE] = profile.get(ADAPTIVE, 0.0) + _clock(model.device) - start
        profile[f"{ADAPTIVE}:late"] = profile.get(f"{ADAPTIVE}:late", 0.0) + late_secs
    return out


def _decode(group: RowGroup, answers: list[list[int]], max_new: int, stop,
            graphs: bool | None = None, parts: dict | None = None) -> tuple[list, list, list, list]:
    """Greedy tokens, their (log-probability, margin), gold-answer logits and (with an exit
    criterion, else empty) the steps of the pass behind each token, of every row of a group. The
    gold answer's rows run every step; an exit criterion cuts only generated tokens' passes, which
    then run eagerly (``extend_exiting``, not the static graphs). parts {"setup", "gold", "passes": seconds}:
    the static decoder's making, the gold rows and the decoding passes are added to them."""
    lap = _laps(group.lates[0].state.device, parts)
    R = len(answers)
    criterion = group.s.exit_criterion
    last = group.last_logits()
    # gold: a_1 from the prompt's last row, a_2.. from the answer's own rows (fresh tails), one
    # batch per run of rows with answers of one length (contiguous: examples are sorted by it)
    gold = [[last[i:i + 1]] for i in range(R)]
    i = 0
    while i < R:
        j = i
        while j < R and len(answers[j]) == len(answers[i]):
            j += 1
        if len(answers[i]) > 1:
            rows = extend(group.rows(i, j), Tails(j - i), [answers[k][:-1] for k in range(i, j)])
            for k in range(i, j):
                gold[k].append(rows[k - i])
        i = j
    lap("gold")
    tokens: list[list[int]] = [[] for _ in range(R)]
    stats: list[list[tuple]] = [[] for _ in range(R)]
    steps: list[list[int]] = [[] for _ in range(R)]
    passed = [group.s.discovery_step if group.truncate else group.s.steps] * R  # the prompt's pass
    chosen = _choose(last)
    done = [False] * R
    if graphs is None:
        graphs = group.lates[0].state.device.type == "cuda"
    static = StaticDecoder(group, max_new - 1) if graphs and group.fast and max_new > 1 and criterion is None else None
    lap("setup")
    tails = Tails(R)
    while True:
        for k, (token, lp, margin) in enumerate(chosen):
            if not done[k]:
                if token in stop:
                    done[k] = True
                else:
                    tokens[k].append(token)
                    stats[k].append((lp, margin))
                    if criterion is not None:
                        steps[k].append(passed[k])
                    done[k] = len(tokens[k]) >= max_new
        if all(done):
            break
        if static is not None:  # rows already done ride along
            chosen = static.step([t for t, _, _ in chosen] if static.passes == 0 else None)
        elif criterion is not None:
            logits, passed = extend_exiting(group, tails, [[t] for t, _, _ in chosen], criterion)
            chosen = _choose(logits[:, -1])
        else:
            chosen = _choose(extend(group, tails, [[t] for t, _, _ in chosen])[:, -1])
    lap("passes")
    return tokens, stats, [torch.cat(g) for g in gold], steps


def _laps(device, parts: dict | None):
    """lap(name): the seconds since the last lap (the first: since this call) added to parts[name]; nothing
    without parts."""
    if parts is None:
        return lambda name: None
    last = [_clock(device)]

    def lap(name: str) -> None:
        now = _clock(device)
        parts[name] += now - last[0]
        last[0] = now
    return lap
