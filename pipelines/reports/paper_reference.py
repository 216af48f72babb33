"""The paper's published numbers (Huginn-0125 on an RTX A6000, the paper's tables), shown beside ours
in the report only where this run's setting matches the paper's (``mismatches`` is empty), always
labelled as the paper's; elsewhere the report prints one line pointing here.

The paper's setting: the Huginn-0125 model family, T=32, t_d=12, w=4, B=32, eta=0.95; controls,
context scaling and the eta / block-size studies on HotpotQA (block size at 2K tokens), the
mechanism study on HotpotQA and GSM8K.
"""

CONTEXT_SCALING = {  # context length -> (density, retained future mass, ΔF1 WISE − Full)
    512: (0.570, 0.978, -0.013),
    1024: (0.434, 0.971, +0.020),
    2048: (0.375, 0.965, +0.052),
    4096: (0.369, 0.961, -0.116),
}
LATE_REUSE_SPEEDUP = {512: 1.15, 1024: 1.32, 2048: 1.61, 4096: 1.76}  # build + 20 calls vs 20 flash
TRAJECTORY_SPEEDUP_4K = 1.36
SAME_BACKEND_SPEEDUP = 2.50
CONTROLS_F1 = {  # HotpotQA, N=100
    "full": 0.226, "wise": 0.232, "size_matched": 0.184, "mass_matched": 0.151,
    "static95": 0.147, "freeze_a": 0.216, "truncate": 0.214,
}
CONTROLS_DENSITY, CONTROLS_FUTURE_MASS = 0.450, 0.967
BLOCK_SIZE_2K = {16: (0.311, 1.14), 32: (0.375, 1.66), 64: (0.447, 1.44), 128: (0.544, 1.24)}  # density, speedup
ETA = {0.90: (0.30, 0.93), 0.95: (0.45, 0.97), 0.99: (0.78, 0.994)}  # density, future mass
MECHANISM = {  # benchmark -> mean tau_S, tau_A, tau_H, tau_O
    "hotpotqa": (14.0, 11.5, 18.9, 19.9),
    "gsm8k": (10.1, 11.4, 21.5, 22.9),
}
ROLLING_JACCARD_AT_12 = 0.967
JACCARD_W12_W32 = 0.899

SETTING = {"T": 32, "t_d": 12, "w": 4, "B": 32, "eta": 0.95}
MODEL = "Huginn-0125"


def is_huginn(family: str | None) -> bool:
    """The model's config names the Huginn family (a published Huginn checkpoint or its preset)."""
    return bool(family) and family.lower().startswith("huginn")


def mismatches(p, family: str | None, benchmarks, paper_benchmarks=("hotpotqa",), vary=(),
               subset: bool = False) -> list[str]:
    """How this run differs from the paper's setting for one table: the model family, the
    benchmarks of the compared rows (equal to ``paper_benchmarks``, or among them with
    ``subset``), and T / t_d / w / B / eta except the ones the table varies. Empty: comparable."""
    out = []
    if not is_huginn(family):
        out.append(f"model {family or 'unknown'} (paper: {MODEL})")
    ours, paper = set(benchmarks), set(paper_benchmarks)
    if not ours or (not ours <= paper if subset else ours != paper):
        out.append(f"benchmarks {', '.join(sorted(ours)) or 'none'} (paper: {', '.join(sorted(paper))})")
    setting = {"T": p.recurrence.steps, "t_d": p.wise.discovery_step, "w": p.wise.window,
               "B": p.wise.block_size, "eta": p.wise.eta}
    out += [f"{k}={setting[k]:g} (paper: {v:g})" for k, v in SETTING.items()
            if k not in vary and setting[k] != v]
    return out


def pointer(what: str, names: str, differs: list[str]) -> str:
    """The line a table gets instead of paper columns."""
    return (f"Paper: {what}, {MODEL} on an RTX A6000, `{names}` in `pipelines/reports/paper_reference.py`; not shown "
            f"beside this run, whose setting differs: {'; '.join(differs)}.")
