"""A checkpoint's answer quality on a fresh generated test world (greedy, Full attention unless a
condition is asked), or a looped retrofit on your own text. The first argument is the mode:

    python -m wise.evaluate cell --benchmark synthhop --context 512 --steps 32 --n 200 --seed 123
    python -m wise.evaluate cell --by-type --by-source    # EM per question type; where wrong answers come from
    python -m wise.evaluate cell --benchmark synthchain --context 512 --steps 32 --condition wise --by-depth
    python -m wise.evaluate table                         # benchmark x context length x T
    python -m wise.evaluate table --update-card           # into <model>/quality.json, then the card
    python -m wise.evaluate lens                          # where in the recurrence the answer appears
    python -m wise.evaluate text --model data/models/smollm2-135m-lma --loops 1 2 4 8 --text FILE
                                                          # a retrofit on your text: NLL per loop count
    python -m wise.evaluate MODE --help                   # the mode's flags and their defaults

``text`` (wise/evaluate/text.py) runs a looped retrofit on the user's own text (NLL per loop count)
and prompt (greedy continuation at each loop count); the other modes ask a generated test world.
Their last line printed is ``EM=<float> F1=<float> n=<int>``: of the cell (cell; lens: at --steps,
Full) or of the table's first cell at T=32 (table). Examples are the first n of the test split for
--seed, their context variants are built exactly as the cohorts stage builds them (BOS counted,
same seed), and the answers come from the pipeline's own generation engine
(``wise.engine.decoding.evaluate_example``, cached decoding; initial state seeded by
``state_seed("<example id>@<context>", init_seed)``), under cell's ``--condition`` (default full).
The WISE settings flags (--steps, --discovery-step, --window, --block-size, --eta, --backend, and
wise_adaptive's --adaptive-*) are generated from ``WiseSettings`` and ``AdaptiveDiscovery`` and
default to their defaults (params.yaml's ``wise.adaptive`` for the rule). Examples whose evidence
alone exceeds the budget are skipped and not counted in n.

On synthchain the default model is the constructed calibration model data/models/wise-chain (built
in a second if the folder is missing), and the line before the last gives the EM the construction
predicts (``wise.analysis.calibration``) for the same examples and settings, with ``mismatches=<k>``: the
examples whose measured answer disagrees with the prediction (the first few ids in brackets).

This package is the command line only: its flags (flags.py), the checkpoint it loads
(model_folder.py) and its modes (modes.py). The prompts come from wise/data/probes.py, the scores
and their breakdowns from wise/analysis/scoring.py, the lens from wise/analysis/lens.py, the table
and the quality bars from wise/training/quality.py, and table --update-card regenerates the model
card through wise/training/card.py (which renders its quality section from quality.json).
"""
from __future__ import annotations

import argparse
import inspect
from typing import Sequence

from wise.evaluate.modes import MODES

PROG = "python -m wise.evaluate"


class OneLineErrorParser(argparse.ArgumentParser):
    """A usage error is one line on stderr (exit status 2): the command, the error, where to look."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class DefaultsHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Each flag's default after its help, where it has one and the help does not say it."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if action.option_strings and default not in (None, argparse.SUPPRESS) and default is not False \
                and "default" not in text:
            text += " (default: %(default)s)"
        return text


def parser() -> argparse.ArgumentParser:
    ap = OneLineErrorParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = ap.add_subparsers(dest="mode", metavar="MODE", required=True,
                              help=", ".join(MODES) + " (each takes --help)")
    for name, (add_flags, run) in MODES.items():
        doc = inspect.cleandoc(run.__doc__)
        p = modes.add_parser(name, help=doc.split("\n")[0], description=doc, formatter_class=DefaultsHelpFormatter)
        add_flags(p)  # each mode's own, the shared ones first
        p.set_defaults(run=run)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.run(args)
