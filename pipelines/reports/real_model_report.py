"""The report's section "A real pretrained model" (written by stage real_eval as `paths.REAL_MD`,
with its figure beside it; the statistics stage puts it into the report). Every number comes from
the tables of pipelines.real.evaluation."""
from __future__ import annotations

from pipelines.config import paths
from pipelines.reports.real_findings import (LABELS, SMALL_N, accuracy_sentence, halting_sentence, loops_label,
                                             nll_sentence, past_note, small_n_warning)


def fmt(x, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def fmt_ci(r: dict, key: str, low: str, high: str, digits: int = 3) -> str:
    if r.get(key) is None:
        return "–"
    return f"{r[key]:.{digits}f} [{r[low]:.{digits}f}, {r[high]:.{digits}f}]"


def fmt_p(x) -> str:
    return "–" if x is None else (f"{x:.3g}" if x >= 0.001 else f"{x:.1e}")


def figure(table: list[dict], halting: list[dict]) -> str:
    """NLL of held-out text and hop-item accuracy against loops, one line per variant (all items);
    the LMA retrofit's accuracy per hop count; accuracy against mean loops of every halting method
    beside the fixed depths (all items)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 3.8))
    per_hop = [(axes[2], "needle", "accuracy", "accuracy_low", "accuracy_high", f"LMA accuracy, {h} hop(s)", h)
               for h in sorted({r["hops"] for r in table if r["hops"] is not None})]
    for ax, task, key, low, high, label, hops in (
            (axes[0], "text", "mean_nll", "nll_low", "nll_high", "held-out text NLL (nats/token)", None),
            (axes[1], "needle", "accuracy", "accuracy_low", "accuracy_high", "hop-item accuracy (all)", None),
            *per_hop):
        for variant in (("lma",) if hops is not None else LABELS):
            rows = sorted((r for r in table if r["variant"] == variant and r["task"] == task and r["hops"] == hops),
                          key=lambda r: r["T"])
            if not rows:
                continue
            xs = [r["T"] for r in rows]
            if variant == "base":
                ax.axhline(rows[0][key], color="black", linestyle=":", label=LABELS[variant])
                continue
            ax.plot(xs, [r[key] for r in rows], marker="o", label=label if hops is not None else LABELS[variant])
            ax.fill_between(xs, [r[low] for r in rows], [r[high] for r in rows], alpha=0.15)
        ax.set_xlabel("loops T")
        ax.set_ylabel("LMA accuracy per hop count" if hops is not None else label)
        ax.set_xscale("log", base=2)
        ticks = sorted({r["T"] for r in table})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
    axes[0].set_yscale("log")
    axes[1].legend(fontsize=8)
    axes[2].legend(fontsize=8)
    halting = [r for r in halting if r["hops"] is None]
    fixed = sorted((r for r in halting if r["kind"] == "fixed"), key=lambda r: r["mean_loops"])
    ax = axes[3]
    ax.plot([r["mean_loops"] for r in fixed], [r["accuracy"] for r in fixed], marker="o", color="gray",
            label="fixed depth (LMA retrofit)")
    for r in halting:
        if r["kind"] != "fixed":
            ax.errorbar(r["mean_loops"], r["accuracy"], yerr=[[r["accuracy"] - r["accuracy_low"]],
                        [r["accuracy_high"] - r["accuracy"]]], marker="s", capsize=3, label=r["method"])
    ax.set_xlabel("mean loops")
    ax.set_ylabel("hop-item accuracy (halting)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.REAL_FIGURE.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(paths.REAL_FIGURE, dpi=110)
    plt.close(fig)
    return paths.REAL_FIGURE.name


def corpus_line(manifest: dict) -> str:
    """The documentation corpus in one sentence, from its manifest (stage real_corpus)."""
    parts = [f"{s} {v['tokens']:,} tokens ({len(v['distributions'])} distributions)"
             for s, v in manifest["splits"].items()]
    return (f"the docstrings and comment blocks of {len(manifest['pyproject_pins'])} pinned distributions and of "
            f"CPython's stdlib, and its language reference, reduced to prose, split by distribution: "
            f"{', '.join(parts)} (`data/real/corpus_manifest.json`)")


def real_model_markdown(p, table: list[dict], halting: list[dict], card: dict, source: dict,
                        block: tuple[int, int], corpus: dict, level: float, device: str) -> str:
    start, k = block
    every = table
    table = [r for r in table if r["hops"] is None]  # over all items; per hop count: hop_lines
    L = [f"Model: **{source['upstream']}** ({source['quantisation']} weights from the pip package "
         f"`{source['distribution']}=={source['version']}`, GGUF sha256 `{source['sha256'][:16]}…`, "
         f"{source['license']}), looped block layers {start}-{start + k - 1} (angular-distance probe, "
         f"at least {p.min_prefix} layers before and {p.min_suffix} after). Text: {corpus_line(corpus)}; "
         f"held-out NLL on {p.eval_windows} test windows of "
         f"{p.window_tokens} tokens; hop task: chains of {', '.join(map(str, p.hop_counts))} hop(s) (key links "
         f"and the last person's city, {p.hop_distractors} distractor people) hidden in {p.needle_words} words of test "
         f"prose, asked through the chat template, {p.eval_needles} items over the hop counts; the same-budget "
         f"T = 1 baseline is measured at T = 1 only; run on {device}, {p.dtype}. Brackets: {100 * level:g}% bootstrap "
         "intervals over examples. Tables: `data/real/*.parquet` (`python -m pipelines.store.query "
         "\"SELECT * FROM real_curves\"`).", ""]
    L += small_sample_label(table, halting)
    L += [f"![NLL and accuracy vs loops]({figure(every, halting)})", ""]
    trained = (p.loops_min, p.loops_max)
    L += curve_lines(table, trained)
    L += hop_lines(every, trained)
    L += [f"**Halting on the LMA retrofit** (hop test items, budget {card['t_max']} loops, floor {card['t_min']}; "
          f"thresholds chosen on {card['examples']['heldout']} held-out items: τ = {fmt(card['tau'], 2)}, "
          f"confidence λ = {fmt(card['confidence_threshold'], 2)}; "
          f"heads fit on {card['examples']['train']} train items; "
          f"best held-out fixed depth T = {card['best_fixed_depth']}). McNemar: exact, two-sided.", ""]
    L += halting_lines(halting)
    return "\n".join(L)


def small_sample_label(table: list[dict], halting: list[dict]) -> list[str]:
    """The section's first line when a table holds fewer than SMALL_N examples: a smoke test, not a measurement."""
    sizes = {task: max((r["n"] for r in table if r["task"] == task), default=0) for task in ("text", "needle")}
    sizes["halting"] = max((r["n"] for r in halting if r.get("hops") is None), default=0)
    small = {k: n for k, n in sizes.items() if 0 < n < SMALL_N}
    if not small:
        return []
    return [f"**Small sample — a smoke test of the pipeline, not a measurement of the model**: n = "
            f"{', '.join(f'{n} ({k})' for k, n in small.items())}. The report shows the GPU study's tables "
            "(benchmarks/results) beside this section when they exist.", ""]


def curve_lines(table: list[dict], trained: tuple[int, int]) -> list[str]:
    """The NLL and needle-accuracy tables (variant x loops), each with n, its sentence and its warnings."""
    table = [r for r in table if r.get("hops") is None]  # over all items; per hop count: hop_lines
    depths = sorted({r["T"] for r in table if r["variant"] != "base"})
    L = []
    for task, title, key, low, high, sentence in (
            ("text", "Held-out text NLL (nats/token)", "mean_nll", "nll_low", "nll_high", nll_sentence(table, trained)),
            ("needle", "Needle accuracy", "accuracy", "accuracy_low", "accuracy_high", accuracy_sentence(table))):
        rows = [r for r in table if r["task"] == task]
        if not rows:
            continue
        L += [f"**{title}**", "", sentence, ""]
        L += small_n_warning(min(r["n"] for r in rows), "examples")
        L += ["| variant | n | " + " | ".join(loops_label(T, trained) for T in depths) + " |",
              "| --- | --- |" + " --- |" * len(depths)]
        for variant in LABELS:
            cells, ns = [], set()
            for T in depths:
                r = next((r for r in rows if (r["variant"], r["T"]) == (variant, T)), None)
                if variant == "base":
                    r = next((r for r in rows if r["variant"] == "base"), None) if T == 1 else None
                cells.append(fmt_ci(r, key, low, high) if r else "")
                ns |= {r["n"]} if r else set()
            if ns:
                L.append(f"| {LABELS[variant]} | {', '.join(map(str, sorted(ns)))} | " + " | ".join(cells) + " |")
        L.append("")
        L += past_note(depths, trained)
    return L


def hop_lines(table: list[dict], trained: tuple[int, int]) -> list[str]:
    """Accuracy per hop count (rows: variant x hop count, columns: loops), n beside every interval."""
    rows = [r for r in table if r["task"] == "needle" and r.get("hops") is not None]
    if not rows:
        return []
    depths = sorted({r["T"] for r in rows})
    L = ["**Accuracy per hop count** (the same items as above, split by the length of their chain)", ""]
    L += small_n_warning(min(r["n"] for r in rows), "examples per hop count")
    L += ["| variant | hops | n | " + " | ".join(loops_label(T, trained) for T in depths) + " |",
          "| --- | --- | --- |" + " --- |" * len(depths)]
    for variant in LABELS:
        for h in sorted({r["hops"] for r in rows}):
            cells = {r["T"]: r for r in rows if (r["variant"], r["hops"]) == (variant, h)}
            if cells:
                ns = ", ".join(map(str, sorted({r["n"] for r in cells.values()})))
                L.append(f"| {LABELS[variant]} | {h} | {ns} | " + " | ".join(
                    fmt_ci(cells[T], "accuracy", "accuracy_low", "accuracy_high") if T in cells else ""
                    for T in depths) + " |")
    return L + [""] + past_note(depths, trained)


def halting_lines(halting: list[dict]) -> list[str]:
    """The halting table over all items, then within each hop count (the same thresholds)."""
    overall = [r for r in halting if r.get("hops") is None]
    L = [halting_sentence(overall), ""]
    L += small_n_warning(min((r["n"] for r in halting), default=SMALL_N), "hop test items")
    L += ["| hops | method | n | accuracy | mean loops | NLL | p vs best fixed | matched fixed | p vs matched | "
          "only method right / only matched right |", "| --- |" + " --- |" * 9]
    for r in overall + [r for r in halting if r.get("hops") is not None]:
        hops = "all" if r.get("hops") is None else r["hops"]
        L.append(f"| {hops} | {r['method']} | {r['n']} | {fmt_ci(r, 'accuracy', 'accuracy_low', 'accuracy_high')} | "
                 f"{fmt(r['mean_loops'], 2)} | {fmt(r['nll'])} | {fmt_p(r['mcnemar_best_p'])} | {r['matched_fixed']} | "
                 f"{fmt_p(r['mcnemar_matched_p'])} | {r['only_method_right']} / {r['only_matched_right']} |")
    L.append("")
    return L
