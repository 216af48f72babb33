"""The project's engine as an lm-evaluation-harness model, registered as ``wise``.

    wise-lm-eval run --model wise \\
        --model_args pretrained=data/models/wise-chain,condition=wise,steps=32,discovery_step=12,window=4 \\
        --tasks <task> --include_path <dir> --output_path out --log_samples

``pretrained`` is the checkpoint (lm-eval's own key for it: lm-eval names the results folder under
``--output_path`` from it, e.g. ``out/data__models__wise-chain/``). A RecurTrace retrofit of a real
decoder reads its base where its config points and uses the base's tokenizer
(``pretrained=data/models/smollm2-135m-lma``); ``base=`` reads the base from another folder (its
fingerprint must be the one the retrofit was trained on).

Settings not given come from the model: ``steps`` is its config's ``mean_recurrence`` (its default
depth; a retrofit's trained depth), ``discovery_step`` and ``window`` the paper's proportions of it
(``PAPER_SETTINGS``' 12 and 4 of 32, rounded half up, 1 <= w <= t_d < T), ``block_size`` and ``eta``
``PAPER_SETTINGS``' (wise.engine.runner). The run spec (``config.wise_run_spec``) names each derived setting and
its rule under ``derived``.

``wise-lm-eval`` (or ``python -m pipelines.lm_eval.model``) is lm-eval's own command line with
this model registered: lm-eval 0.4 finds third-party models only when their module has been
imported (its registry reads no entry points), so a plain ``lm_eval --model wise`` does not see it.
From Python: ``import pipelines.lm_eval.model`` then ``lm_eval.simple_evaluate(model="wise", ...)``.

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
sample (``pipelines.lm_eval.pairs``). The run spec (weights id, condition, settings, backend) goes
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
from wise.engine.runner import PAPER_SETTINGS, WiseSettings, state_seed
from wise.models.checkpoint import LOOPED_MODEL_TYPE, TOKENIZER_NAME, load_checkpoint
from wise.models.dtypes import DTYPES

_DEFAULT = PAPER_SETTINGS  # the paper's proportions and the flags' defaults
_RULE = AdaptiveDiscovery()


def _arg(kwargs: dict, key: str, kind, default):
    """A model_args value converted to `kind`, or a one-line error naming the key."""
    value = kwargs.pop(key, default)
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"--model_args {key}={value!r}: not a {kind.__name__}") from None


def depth_settings(steps: int) -> tuple[int, int]:
    """(t_d, w) for T = `steps` in the paper's proportions (``PAPER_SETTINGS``: t_d 12 and w 4
    of T 32), rounded half up, with 1 <= w <= t_d < T (t_d = T = 1 at one loop: every condition Full)."""
    def share(part: int) -> int:  # round(steps * part / 32), halves up
        return (2 * steps * part + _DEFAULT.steps) // (2 * _DEFAULT.steps)

    discovery = max(1, min(steps - 1, share(_DEFAULT.discovery_step))) if steps > 1 else 1
    return discovery, max(1, min(discovery, share(_DEFAULT.window)))


@register_model("wise")
class WiseLM(TemplateLM):
    """One condition of the WISE engine on one checkpoint (model_args: see ``__init__``)."""

    def __init__(self, pretrained: str = "data/models/wise-chain", condition: str = "full", **kwargs) -> None:
        super().__init__()
        if "source" in kwargs:
            raise ValueError("--model_args source=...: name the checkpoint pretrained=... (lm-eval's key, "
                             "from which it names the results folder)")
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
        self.batch_examples = (1 << 20 if str(batch).startswith("auto")
                               else _arg({"batch_size": batch}, "batch_size", int, 8))
        revision = kwargs.pop("revision", None)
        base = kwargs.pop("base", None)  # a retrofit's base folder, when not where its config points
        tokenizer = kwargs.pop("tokenizer", None) or base  # a retrofit has its base's tokenizer
        # given settings, typed now; the depth ones left out follow the model's depth (below)
        depth = {k: _arg(kwargs, k, int, None) if k in kwargs else None for k in ("steps", "discovery_step", "window")}
        given = dict(block_size=_arg(kwargs, "block_size", int, _DEFAULT.block_size),
                     eta=_arg(kwargs, "eta", float, _DEFAULT.eta), backend=backend,
                     adaptive=AdaptiveDiscovery(threshold=_arg(kwargs, "adaptive_threshold", float, _RULE.threshold),
                                                min_step=_arg(kwargs, "adaptive_min_step", int, _RULE.min_step),
                                                max_step=_arg(kwargs, "adaptive_max_step", int, _RULE.max_step),
                                                window=_arg(kwargs, "adaptive_window", int, _RULE.window)))
        try:
            given["exit_criterion"] = parse_exit(kwargs.pop("exit", None), kwargs.pop("exit_threshold", None),
                                                 kwargs.pop("exit_min_step", None))
        except ValueError as exc:
            raise ValueError(f"--model_args: {exc}") from None
        if given["exit_criterion"] is not None and self.generation != "cached":
            raise ValueError("--model_args exit=...: exit criteria run only with generation=cached")
        unknown = sorted(k for k in kwargs if k not in ("max_batch_size",))  # lm-eval's own extras
        if unknown:
            raise ValueError(f"--model_args: unknown key(s) {', '.join(unknown)}")
        self.condition, self.source, self.base = condition, pretrained, base
        self.device_name, self.dtype = device, dtype
        if base is None:
            self.model = load_checkpoint(pretrained, dtype=DTYPES[dtype], device=device, revision=revision)
        else:
            from wise.models.looped.checkpoint import load_retrofit

            self.model = load_retrofit(pretrained, dtype=DTYPES[dtype], device=device, base=base)
        if not hasattr(self.model, "core_step"):  # a plain decoder (e.g. preset:smollm2-135m-instruct)
            raise ValueError(f"--model_args pretrained={pretrained}: a decoder without loops; the wise model "
                             "runs looped models (a RecurTrace retrofit of it, e.g. data/models/smollm2-135m-lma)")
        self.settings, self.derived = self._settings(depth, given)
        if tokenizer is not None:
            path = Path(tokenizer)
            self.tokenizer = load_tokenizer(path / "tokenizer.json" if path.is_dir() else path)
        elif getattr(self.model.config, "model_type", None) == LOOPED_MODEL_TYPE and \
                not (Path(pretrained) / TOKENIZER_NAME).is_file():  # a retrofit whose folder has no tokenizer copy
            from wise.models.looped.checkpoint import base_folder

            self.tokenizer = load_tokenizer(base_folder(self.model.config, pretrained) / TOKENIZER_NAME)
        else:
            text = model_text(pretrained, revision)
            self.tokenizer = text.tokenizer
        cfg = self.model.config
        self._bos, self._stops = cfg.bos_token_id, (cfg.eos_token_id, *cfg.extra_eos_token_ids)
        self._max_length = cfg.max_positions

    def _settings(self, depth: dict, given: dict) -> tuple[WiseSettings, dict[str, str]]:
        """The settings: those given, the depth ones left out from the model (T: its config's
        mean_recurrence; t_d, w: ``depth_settings``), and what was derived, by rule."""
        steps, discovery, window = depth["steps"], depth["discovery_step"], depth["window"]
        derived = {}
        if steps is None:
            steps = self.model.config.mean_recurrence
            derived["steps"] = f"the model config's mean_recurrence ({steps})"
        proportional = depth_settings(steps)
        if discovery is None:
            discovery = proportional[0] if window is None else max(proportional[0], window)
            derived["discovery_step"] = f"{_DEFAULT.discovery_step}/{_DEFAULT.steps} of steps, rounded ({discovery})"
        if window is None:
            window = min(proportional[1], discovery)
            derived["window"] = f"{_DEFAULT.window}/{_DEFAULT.steps} of steps, rounded, <= discovery_step ({window})"
        try:
            settings = WiseSettings(steps=steps, discovery_step=discovery, window=window, **given)
        except ValueError as exc:
            raise ValueError(f"--model_args: {exc}") from None
        return settings, derived

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
            "condition": self.condition, "derived": self.derived,
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
            self._exit_steps = (steps + sum(sum(r.token_steps) for r in out),
                                tokens + sum(len(r.token_steps) for r in out))
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
