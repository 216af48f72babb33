"""Expected values beside measured ones when the model is the constructed calibration model.

For wise-chain on synthchain every (example, condition) has an expected outcome derived from the
construction (``wise.analysis.calibration``); the conditions and sweep stages store it next to the measured
one (``expected_em``, NULL for any other model or benchmark) and the report compares them.
"""
from __future__ import annotations

from functools import lru_cache

from pipelines.config.run_spec import wise_settings
from wise.analysis.calibration_exits import expected_exits
from wise.analysis.calibration import ADAPTIVE, adaptive_step, expected_outcome, expected_taus, parse_layout
from wise.models.checkpoint import load_config, resolve_model_source
from wise.models.construct import NAME as CALIBRATION_MODEL
from wise.engine.runner import WiseSettings


def is_calibration_model(source: str) -> bool:
    if source.startswith("preset:"):
        return False
    try:
        return load_config(resolve_model_source(source)).name == CALIBRATION_MODEL
    except (FileNotFoundError, ValueError):
        return False


class Oracle:
    """Expected EM per (cohort row, condition, settings) and expected taus, for synthchain rows."""

    def __init__(self, tokenizer):
        self._tok = tokenizer

    @lru_cache(maxsize=4096)
    def _layout(self, token_ids: tuple[int, ...]):
        return parse_layout([self._tok.id_to_token(i) for i in token_ids])

    def layout(self, row: dict):
        return self._layout(tuple(row["token_ids"])) if row["benchmark"] == "synthchain" else None

    def em(self, row: dict, condition: str, s: WiseSettings) -> float | None:
        lay = self.layout(row)
        return None if lay is None else float(expected_outcome(lay, condition, s).correct)

    def discovery_step(self, row: dict, condition: str, s: WiseSettings) -> int | None:
        """The depth the construction says the condition's late steps start after (wise_adaptive:
        the step its criterion fires on this prompt)."""
        lay = self.layout(row)
        if lay is None:
            return None
        return adaptive_step(lay, s) if condition == ADAPTIVE else s.discovery_step

    def exits(self, row: dict, condition: str, s: WiseSettings) -> tuple[tuple[int, ...] | None, bool] | None:
        """(steps behind each answer token, or None where the construction does not fix them; the
        answer right?) under `s` (its exit criterion, or a fixed depth), for two-token synthchain rows."""
        lay = self.layout(row)
        if lay is None or lay.follow is None:
            return None
        try:
            want = expected_exits(lay, condition, s, s.exit_criterion)
        except ValueError:  # a threshold outside the ranges where the construction fixes the exit step
            return None
        return want.token_steps, want.correct

    def taus(self, row: dict, steps: int, run: int, first: int) -> dict | None:
        lay = self.layout(row)
        return None if lay is None else expected_taus(lay, steps, run=run, first=first)


def oracle_for(source: str, tokenizer) -> Oracle | None:
    return Oracle(tokenizer) if is_calibration_model(source) else None


def settings_of(p) -> WiseSettings:
    """The run's settings, from the one builder the conditions stage uses (the rules stay this module's)."""
    return wise_settings(p)


def expected_table(p, cohort: list[dict], tokenizer) -> list[tuple[str, int, float]]:
    """(condition, n, expected EM) over a cohort's synthchain rows under the params' settings."""
    oracle, s = Oracle(tokenizer), settings_of(p)
    rows = [r for r in cohort if r["benchmark"] == "synthchain"]
    return [(c, len(rows), sum(oracle.em(r, c, s) for r in rows) / max(1, len(rows))) for c in p.conditions.names]


def main() -> int:
    """Print the expected EM per condition of the cohort the cohorts stage wrote (no model run), and
    wise_adaptive's expected mean discovery step."""
    from pipelines.config import paths
    from pipelines.store.artifacts import read_parquet
    from pipelines.config.params import load_params
    from wise.data.synthchain import build_tokenizer

    p = load_params()
    cohort, tok = read_parquet(paths.COHORT).to_pylist(), build_tokenizer()
    for c, n, em in expected_table(p, cohort, tok):
        print(f"{c:13s} {n:4d}  {em:.3f}")
    # wise_adaptive: the mean discovery step its criterion is expected to choose (vs wise.discovery_step)
    if ADAPTIVE in p.conditions.names:
        oracle, s = Oracle(tok), settings_of(p)
        steps = [oracle.discovery_step(r, ADAPTIVE, s) for r in cohort if r["benchmark"] == "synthchain"]
        print(f"{ADAPTIVE} mean discovery step {sum(steps) / max(1, len(steps)):.2f} "
              f"(wise.discovery_step = {p.wise.discovery_step})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
