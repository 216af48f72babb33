"""Answer-quality metrics with each benchmark's official normalisation.

Text benchmarks (HotpotQA, 2WikiMultihopQA, the synthetic multi-hop task and synthchain) use the
SQuAD/HotpotQA rule: lowercase, strip punctuation, drop the articles a/an/the, collapse
whitespace; token F1 over the normalised words; and the HotpotQA special case that a yes / no /
noanswer answer scores F1 0 unless prediction and gold are equal after normalisation.

Numeric benchmarks (GSM8K and the synthetic arithmetic task) compare the last number in the
prediction with the last number in the gold answer, exactly ("1,000" == "1000", "3.0" == "3");
EM and F1 are both 1.0 or 0.0.

Gold may be a string or a list of acceptable strings; the score is the max over them.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation

TEXT_BENCHMARKS = frozenset({"hotpotqa", "2wikimultihopqa", "synthhop", "synthchain"})
NUMERIC_BENCHMARKS = frozenset({"gsm8k", "syntharith"})
BENCHMARKS = TEXT_BENCHMARKS | NUMERIC_BENCHMARKS

# Answers that HotpotQA's official F1 refuses to give partial credit to.
_SPECIAL_ANSWERS = frozenset({"yes", "no", "noanswer"})
_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
# A number: optional minus (not when it joins two numbers, "10-15"), digits with optional thousands
# commas, optional decimals. Trailing sentence commas are stripped with the thousands separators.
_NUMBER = re.compile(r"(?<![\d.])-?\d[\d,]*(?:\.\d+)?")

# Where a wrong answer was copied from (``answer_source``), in the order they are checked.
ANSWER_SOURCES = ("evidence", "distractor", "question", "nowhere", "empty")

# Answer-change categories versus the Full run; "unchanged" covers both-correct and both-wrong
# with the same normalised prediction.
ANSWER_CHANGES = ("unchanged", "correct_to_wrong", "wrong_to_correct", "both_wrong_different")


def _check(benchmark: str) -> str:
    if benchmark not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {benchmark!r}; expected one of {sorted(BENCHMARKS)}")
    return benchmark


def _normalize_text(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def last_number(s: str) -> Decimal | None:
    """The last number in s as a Decimal ("1,000" -> 1000, "-3.50" -> -3.5), or None."""
    for token in reversed(_NUMBER.findall(s)):
        try:
            return Decimal(token.replace(",", ""))
        except InvalidOperation:  # pragma: no cover - the regex only yields valid decimals
            continue
    return None


def normalize_answer(s: str, benchmark: str) -> str:
    """The benchmark's normalised form: cleaned words for text tasks; for numeric tasks the last
    number in canonical decimal form ("3.0" -> "3", "1,000" -> "1000"), or "" if there is none."""
    if _check(benchmark) in NUMERIC_BENCHMARKS:
        x = last_number(s)
        if x is None:
            return ""
        # normalize() drops trailing zeros; format "f" avoids exponent notation (1E+3 -> 1000).
        out = format(x.normalize(), "f")
        return "0" if out in ("-0", "0") else out
    return _normalize_text(s)


def _golds(gold: str | Sequence[str]) -> list[str]:
    golds = [gold] if isinstance(gold, str) else list(gold)
    if not golds:
        raise ValueError("gold must be a string or a non-empty list of strings")
    return golds


def _numeric_equal(prediction: str, gold: str) -> float:
    p, g = last_number(prediction), last_number(gold)
    return float(p is not None and g is not None and p == g)


def _em_one(prediction: str, gold: str, benchmark: str) -> float:
    if benchmark in NUMERIC_BENCHMARKS:
        return _numeric_equal(prediction, gold)
    return float(_normalize_text(prediction) == _normalize_text(gold))


def _f1_one(prediction: str, gold: str, benchmark: str) -> float:
    if benchmark in NUMERIC_BENCHMARKS:
        return _numeric_equal(prediction, gold)
    p, g = _normalize_text(prediction), _normalize_text(gold)
    if (p in _SPECIAL_ANSWERS or g in _SPECIAL_ANSWERS) and p != g:
        return 0.0
    p_tok, g_tok = p.split(), g.split()
    common = sum((Counter(p_tok) & Counter(g_tok)).values())
    if common == 0:  # includes empty prediction or gold, as in the official script
        return 0.0
    precision, recall = common / len(p_tok), common / len(g_tok)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, gold: str | Sequence[str], benchmark: str) -> float:
    """1.0 if the prediction equals some gold answer after the benchmark's normalisation."""
    _check(benchmark)
    return max(_em_one(prediction, g, benchmark) for g in _golds(gold))


def f1(prediction: str, gold: str | Sequence[str], benchmark: str) -> float:
    """Token F1 against the best-matching gold answer (numeric tasks: same as exact_match)."""
    _check(benchmark)
    return max(_f1_one(prediction, g, benchmark) for g in _golds(gold))


def answer_change(
    pred_cond: str,
    pred_full: str,
    correct_cond: bool,
    correct_full: bool,
    benchmark: str | None = None,
) -> str:
    """How a condition's answer moved relative to the Full run on the same example.

    correct_* are the caller's correctness calls (the pipeline uses EM == 1). Returns one of
    ANSWER_CHANGES: "correct_to_wrong", "wrong_to_correct", "both_wrong_different" (both wrong and
    the predictions differ after normalisation; whitespace-stripped comparison when benchmark is
    None), otherwise "unchanged".
    """
    if correct_full and not correct_cond:
        return "correct_to_wrong"
    if correct_cond and not correct_full:
        return "wrong_to_correct"
    if not correct_cond and not correct_full:
        if benchmark is None:
            same = pred_cond.strip() == pred_full.strip()
        else:
            same = normalize_answer(pred_cond, benchmark) == normalize_answer(pred_full, benchmark)
        if not same:
            return "both_wrong_different"
    return "unchanged"


def answer_source(prediction: str, question: str, passages: Sequence[tuple[str, bool]],
                  benchmark: str) -> str:
    """Where a prediction's text occurs in the prompt: "evidence" (in an evidence passage),
    "distractor" (only in distractor passages), "question" (only in the question), "nowhere", or
    "empty" (nothing left after normalisation). `passages` are (text, is_evidence) pairs. Text
    benchmarks match normalised whole words; numeric ones the normalised number among the
    text's numbers. Used on wrong answers: does the model follow a wrong chain or copy a
    plausible entity from the wrong passage?"""
    pred = normalize_answer(prediction, benchmark)
    if not pred:
        return "empty"
    numeric = benchmark in NUMERIC_BENCHMARKS

    def occurs(text: str) -> bool:
        if numeric:
            return pred in {normalize_answer(n, benchmark) for n in _NUMBER.findall(text)}
        return f" {pred} " in f" {_normalize_text(text)} "

    if any(occurs(text) for text, evidence in passages if evidence):
        return "evidence"
    if any(occurs(text) for text, evidence in passages if not evidence):
        return "distractor"
    return "question" if occurs(question) else "nowhere"
