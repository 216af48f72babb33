"""The project's engine as an lm-evaluation-harness model, registered as ``wise``.

    wise-lm-eval run --model wise \\
        --model_args source=data/models/wise-chain,condition=wise,steps=32,discovery_step=12,window=4 \\
        --tasks <task> --include_path <dir> --output_path out --log_samples

A RecurTrace retrofit of a real decoder takes its base folder too, whose tokenizer it uses
(``source=data/models/smollm2-135m-lma,base=data/models/smollm2-135m-instruct``; the base's
fingerprint must be the one the retrofit was trained on).

``wise-lm-eval`` (or ``python -m pipelines.lm_eval_model``) is lm-eval's own command line with
this model registered: lm-eval 0.4 finds third-party models only when their module has been
imported (its registry reads no entry points), so a plain ``lm_eval --model wise`` does not see it.
From Python: ``import pipelines.lm_eval_model`` then ``lm_eval.simple_evaluate(model="wise", ...)``.

Every request runs through ``wise.engine.decoding.evaluate_examples`` with one condition applied
to every forward (cached decoding; requests whose prompts have one length decode as one batch):
- ``loglikelihood``: the continuation's teacher-forced log-probability (the engine's gold
  log-probability, summed over its tokens) and whether greedy decoding emits exactly it;
- ``loglikelihood_rolling``: the same over lm-eval's disjoint windows of the model's positions;
- ``generate_until``: greedy decoding (sampling is refused), cut at the first ``until`` string.
Huginn's per-token exit criteria (``wise.engine.exit_criteria``; cached generation) cut the steps of
every generated token: ``exit=kl,exit_threshold=5e-4,exit_min_step=4`` (threshold: the criterion's
default when left out; min step 1); the results' ``config.wise_run_spec.exit`` then holds the
criterion and the mean recurrence steps per generated token.
A request's initial recurrent state is seeded from its context text (``state_seed``), so two runs
that differ only in the condition start every request from the same state and pair sample by
sample (``pipelines.lm_eval_pairs``). The run spec (weights id, condition, settings, backend) goes
into the results' ``config`` block.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from pipelines.cohorts import model_text
from pipelines.config.run_spec import weights_id
from wise.data.tokenizer import load_tokenizer
from wise.engine.conditions import ALL_CONDITIONS
from wise.engine.decoding import GENERATION_MODES, evaluate_examples
from wise.engine.discovery_depth import AdaptiveDiscovery
from wise.engine.exit_criteria import parse_exit
from wise.engine.routing import BACKENDS
from wise.engine.runner import WiseSettings, state_seed
from wise.models.checkpoint import load_checkpoint
from wise.models.dtypes import DTYPES

_DEFAULT = WiseSettings()
_RULE = AdaptiveDiscovery()


def _arg(kwargs: dict, key: str, kind, default):
    """A model_args value converted to `kind`, or a one-line error naming the key."""
    value = kwargs.pop(key, default)
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"--model_args {key}={value!r}: not a {kind.__name__}") from None


@register_model("wise")
class WiseLM(TemplateLM):
    """One condition of the WISE engine on one checkpoint (model_args: see ``__init__``)."""

    def __init__(self, source: str = "data/models/wise-chain", condition: str = "full", **kwargs) -> None:
        super().__init__()
        if condition not in ALL_CONDITIONS:
            raise ValueError(f"--model_args condition={condition!r}: one of {', '.join(ALL_CONDITIONS)}")
        device = kwargs.pop("device", "auto")
        device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else str(device)
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {device!r} but this machine has no CUDA (lm-eval's --device defaults "
                             "to cuda:0): pass --device cpu")
        backend = kwargs.pop("backend", "auto")
        backend = ("kernel" if device.startswith("cuda") else "gather") if backend == "auto" else str(backend)
        if backend not in BACKENDS:
            raise ValueError(f"--model_args backend={backend!r}: one of auto, {', '.join(BACKENDS)}")
        dtype = str(kwargs.pop("dtype", "float32"))
        if dtype not in DTYPES:
            raise ValueError(f"--model_args dtype={dtype!r}: one of {', '.join(DTYPES)}")
        self.generation = str(kwargs.pop("generation", "cached"))
        if self.generation not in GENERATION_MODES:
            raise ValueError(f"--model_args generation={self.generation!r}: one of {', '.join(GENERATION_MODES)}")
        self.init_seed = _arg(kwargs, "init_seed", int, 0)
        batch = kwargs.pop("batch_size", 8)  # lm-eval's --batch_size; "auto": the engine sizes its batches
        self.batch_examples = 1 << 20 if str(batch).startswith("auto") else _arg({"batch_size": batch}, "batch_size", int, 8)
        revision = kwargs.pop("revision", None)
        base = kwargs.pop("base", None)  # a retrofit's base folder, when not where its config points
        tokenizer = kwargs.pop("tokenizer", None) or base  # a retrofit has its base's tokenizer
        try:
            self.settings = WiseSettings(
                steps=_arg(kwargs, "steps", int, _DEFAULT.steps),
                discovery_step=_arg(kwargs, "discovery_step", int, _DEFAULT.discovery_step),
                window=_arg(kwargs, "window", int, _DEFAULT.window),
                block_size=_arg(kwargs, "block_size", int, _DEFAULT.block_size),
                eta=_arg(kwargs, "eta", float, _DEFAULT.eta), backend=backend,
                adaptive=AdaptiveDiscovery(threshold=_arg(kwargs, "adaptive_threshold", float, _RULE.threshold),
                                           min_step=_arg(kwargs, "adaptive_min_step", int, _RULE.min_step),
                                           max_step=_arg(kwargs, "adaptive_max_step", int, _RULE.max_step),
                                           window=_arg(kwargs, "adaptive_window", int, _RULE.window)),
                exit_criterion=parse_exit(kwargs.pop("exit", None), kwargs.pop("exit_threshold", None),
                                          kwargs.pop("exit_min_step", None)))
        except ValueError as exc:
            raise ValueError(f"--model_args: {exc}") from None
        if self.settings.exit_criterion is not None and self.generation != "cached":
            raise ValueError("--model_args exit=...: exit criteria run only with generation=cached")
        unknown = sorted(k for k in kwargs if k not in ("max_batch_size",))  # lm-eval's own extras
        if unknown:
            raise ValueError(f"--model_args: unknown key(s) {', '.join(unknown)}")
        self.condition, self.source, self.base, self.device_name, self.dtype = condition, source, base, device, dtype
        if base is None:
            self.model = load_checkpoint(source, dtype=DTYPES[dtype], device=device, revision=revision)
        else:
            from wise.models.looped.checkpoint import load_retrofit

            self.model = load_retrofit(source, dtype=DTYPES[dtype], device=device, base=base)
        if tokenizer is not None:
            path = Path(tokenizer)
            self.tokenizer = load_tokenizer(path / "tokenizer.json" if path.is_dir() else path)
            cfg = self.model.config
            self._bos, self._stops = cfg.bos_token_id, (cfg.eos_token_id, *cfg.extra_eos_token_ids)
            self._max_length = cfg.max_positions
        else:
            text = model_text(source, revision)
            self.tokenizer, self._bos, self._stops = text.tokenizer, text.bos_id, text.stop_ids
            self._max_length = text.max_positions

    # --- what lm-eval asks of a model ---------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self._stops[0]

    @property
    def prefix_token_id(self) -> int:
        return self._bos

    @property
    def max_length(self) -> int:
        return self._max_length

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tokenizer.encode(string, add_special_tokens=add_special_tokens is not False).ids

    def tok_decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def get_model_info(self) -> dict:
        s = self.settings
        return {"wise_run_spec": {
            "source": self.source, "base": self.base, "weights_id": weights_id(self.source),
            "condition": self.condition,
            "steps": s.steps, "discovery_step": s.discovery_step, "window": s.window, "block_size": s.block_size,
            "eta": s.eta, "backend": s.backend, "generation": self.generation, "init_seed": self.init_seed,
            "dtype": self.dtype, "device": self.device_name, "exit": self._exit_info(),
            "adaptive": {"threshold": s.adaptive.threshold, "min_step": s.adaptive.min_step,
                         "max_step": s.adaptive.max_step, "window": s.adaptive.window}}}

    def _exit_info(self) -> dict | None:
        """The exit criterion and the mean recurrence steps per generated token so far (None without one)."""
        c = self.settings.exit_criterion
        if c is None:
            return None
        steps, tokens = getattr(self, "_exit_steps", (0, 0))
        return {"criterion": c.name, "threshold": c.threshold, "min_step": c.min_step, "tokens": tokens,
                "mean_steps_per_token": steps / tokens if tokens else None}

    def _run(self, items: list[tuple[list[int], list[int], str]], max_new: int, stop: set[int]) -> list:
        """The condition's run of each (prompt ids, gold ids, seed text), batched by the engine."""
        out = []
        for i in range(0, len(items), self.batch_examples):
            chunk = items[i:i + self.batch_examples]
            runs = evaluate_examples(self.model, [(p, g, state_seed(key, self.init_seed)) for p, g, key in chunk],
                                     [self.condition], self.settings, max_new, stop, self.generation)
            out.extend(r[self.condition] for r in runs)
        if self.settings.exit_criterion is not None:  # for get_model_info: every token decoded so far
            steps, tokens = getattr(self, "_exit_steps", (0, 0))
            self._exit_steps = (steps + sum(sum(r.token_steps) for r in out), tokens + sum(len(r.token_steps) for r in out))
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """(sum of the continuation's log-probabilities, greedy == continuation) per request; requests
        with one continuation length go to the engine together (it batches equal prompt lengths)."""
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        by_len: dict[int, list[int]] = {}
        for i, (_, ctx, cont) in enumerate(requests):
            if not cont:
                raise ValueError(f"request {i}: an empty continuation has no log-likelihood")
            by_len.setdefault(len(cont), []).append(i)
        bar = tqdm(total=len(requests), desc=f"wise {self.condition} loglikelihood", disable=disable_tqdm)
        for n, idx in by_len.items():
            items = [(list(requests[i][1]), list(requests[i][2]), self._key(requests[i])) for i in idx]
            for i, run, (_, gold, _) in zip(idx, self._run(items, n, set()), items):
                results[i] = (run.gold_logprob * n, run.tokens[:n] == gold)
            bar.update(len(idx))
        bar.close()
        return results

    @staticmethod
    def _key(request) -> str:
        (context, _), ctx, _ = request
        return context if context else "ids:" + ",".join(map(str, ctx))

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The text's log-likelihood: lm-eval's disjoint windows of the model's positions (the first
        after the BOS token), each scored as a continuation of its context."""
        out = []
        for req in tqdm(requests, desc=f"wise {self.condition} rolling", disable=disable_tqdm):
            (text,) = req.args
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok_encode(text, add_special_tokens=False), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1)]
            scored = self._loglikelihood_tokens([(("", ""), list(ctx), list(cont)) for ctx, cont in windows],
                                                disable_tqdm=True)
            out.append(sum(lp for lp, _ in scored))
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations, cut at the first `until` string; requests with the same generation
        arguments go to the engine together."""
        groups: dict[tuple, list[int]] = {}
        for i, req in enumerate(requests):
            context, gen = req.args
            gen = dict(gen or {})
            if gen.get("do_sample") or float(gen.get("temperature", 0.0) or 0.0) > 0:
                raise ValueError(f"request {i}: the wise model decodes greedily (do_sample / temperature > 0 refused)")
            until = gen.get("until") or []
            until = (until,) if isinstance(until, str) else tuple(until)
            groups.setdefault((int(gen.get("max_gen_toks", 256)), until), []).append(i)
        out: list[str | None] = [None] * len(requests)
        bar = tqdm(total=len(requests), desc=f"wise {self.condition} generate", disable=disable_tqdm)
        for (max_new, until), idx in groups.items():
            items = [(self.tok_encode(requests[i].args[0]), [], requests[i].args[0]) for i in idx]  # no gold
            for i, run in zip(idx, self._run(items, max_new, set(self._stops))):
                text = self.tok_decode(run.tokens)
                cuts = [text.index(u) for u in until if u and u in text]
                out[i] = text[:min(cuts)] if cuts else text
            bar.update(len(idx))
        bar.close()
        return out


def main(argv: list[str] | None = None) -> None:
    """lm-eval's command line, with the ``wise`` model registered (importing this module did it)."""
    from lm_eval.__main__ import cli_evaluate

    sys.argv = [sys.argv[0], *(sys.argv[1:] if argv is None else argv)]
    cli_evaluate()


if __name__ == "__main__":
    main()
