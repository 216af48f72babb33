"""The report: its HTML page (Python-Markdown, tables extension) has every table and image; the
paper's numbers stand beside ours only where the run's setting matches the paper's (Huginn family,
the table's benchmark, T / t_d / w / B / eta), elsewhere one line points to
pipelines/reports/paper_reference.py and says what differs; it says what the bootstrap resampled."""
import base64
import dataclasses
from html.parser import HTMLParser
import re
from pathlib import Path

import pytest

# pipelines.statistics imports duckdb (pipelines.store.db); the GPU image has none: skip, don't fail collection.
pytest.importorskip("duckdb")

from pipelines.config.params import load_params  # noqa: E402
from pipelines.reports.report import build_markdown, markdown_to_html, paper_comparisons, table  # noqa: E402
from pipelines.statistics import summarise  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIGURES = {k: f"figures/{k}.png" for k in ("fraction", "context", "speedup", "delta_f1", "block_size", "jaccard")}


def preset(name: str):
    return load_params(ROOT / "params" / name)


def test_paper_comparisons_follow_model_family_benchmark_and_settings():
    default = load_params(ROOT / "params.yaml")  # the calibration model on synthchain
    cmp = paper_comparisons(default, "wise-chain")
    assert all(any("model wise-chain" in m for m in why) for why in cmp.values()), cmp
    huginn = preset("huginn-paper.yaml")  # HotpotQA + 2Wiki, the paper's settings
    cmp = paper_comparisons(huginn, "huginn")
    assert cmp["controls"] == []  # compared on the HotpotQA rows
    assert cmp["context"] == ["benchmarks 2wikimultihopqa, hotpotqa (paper: hotpotqa)"]
    assert cmp["block_size"] == cmp["context"]  # sweeps at 2048 there
    assert cmp["mechanism"] and cmp["stability"]
    mechanism = preset("huginn-mechanism.yaml")  # HotpotQA + GSM8K
    cmp = paper_comparisons(mechanism, "huginn-0125")
    assert cmp["mechanism"] == [] and cmp["stability"] == []
    other = dataclasses.replace(huginn, wise=dataclasses.replace(huginn.wise, eta=0.9, block_size=64))
    cmp = paper_comparisons(other, "huginn")
    assert cmp["controls"] == ["B=64 (paper: 32)", "eta=0.9 (paper: 0.95)"]
    assert "eta=0.9 (paper: 0.95)" not in cmp["eta"]  # the eta study varies eta


def _summary(p, benchmark: str):
    rows = []
    for i in range(4):
        for cond in p.conditions.names:
            rows.append({"benchmark": benchmark, "context_length": 512, "condition": cond,
                         "example_id": f"e{i}@512", "base_id": f"e{i}", "f1": 0.5, "em": 1.0, "full_f1": 0.5,
                         "full_em": 1.0, "delta_f1": 0.0, "delta_em": 0.0, "delta_logprob": 0.0,
                         "gold_logprob": -1.0, "full_logprob": -1.0, "density": 0.4, "retained_future_mass": 0.9,
                         "answer_change": "same", "expected_em": None, "support_matches_trace": None})
    return summarise(rows, p)


def _markdown(p, family: str, benchmark: str) -> str:
    p = dataclasses.replace(p, statistics=dataclasses.replace(p.statistics, bootstrap_resamples=100))
    d = {"summary": _summary(p, benchmark), "timing": [], "convergence": [], "stability": {}, "sweeps": [],
         "scaling": [], "figures": FIGURES, "paper": paper_comparisons(p, family), "calibration": None}
    return build_markdown(p, d)


def test_paper_controls_appear_only_beside_a_matching_run():
    huginn = preset("huginn-paper.yaml")
    shown = _markdown(huginn, "huginn", "hotpotqa")
    assert "F1 (paper)" in shown and "0.232" in shown  # WISE's published HotpotQA F1
    for family, bench in (("wise-small", "hotpotqa"), ("huginn", "2wikimultihopqa")):
        p = huginn if bench == "hotpotqa" else dataclasses.replace(
            huginn, cohorts=dataclasses.replace(huginn.cohorts, benchmarks=(bench,), sources={}))
        text = _markdown(p, family, bench)
        assert "F1 (paper)" not in text and "0.232" not in text, (family, bench)
        assert "`CONTROLS_F1, CONTROLS_DENSITY, CONTROLS_FUTURE_MASS` in `pipelines/reports/paper_reference.py`" in text
    assert "draw *base examples*" in shown  # what the bootstrap resampled

MD = "\n".join([
    "# WISE report", "",
    "Columns marked *paper* are Huginn's; rows that differ: **0** of 12 (`wise.analysis.calibration`).", "",
    "## Table 1 — controls", "",
    *table(["condition", "F1", "ΔF1 [CI]"], [["full", "0.500", "+0.000 [+0.000, +0.000]"],
                                             ["wise", "0.480", "-0.020 [-0.050, +0.010]"]]),
    "![ΔF1 by condition](figures/delta_f1_by_condition.png)", "",
    "## Context scaling", "",
    *table(["context", "density"], [["512", "0.25"]]),
    "![density vs context](figures/context_scaling.png)", "",
])


def test_html_has_every_table_image_and_heading():
    page = markdown_to_html(MD, title="WISE <report>")
    assert page.startswith("<!doctype html>") and "<title>WISE &lt;report&gt;</title>" in page
    assert "border-collapse:collapse" in page  # the page's own style
    tables = re.findall(r"<table>.*?</table>", page, re.S)
    assert len(tables) == 2
    assert re.findall(r"<th>(.*?)</th>", tables[0]) == ["condition", "F1", "ΔF1 [CI]"]
    assert re.findall(r"<td[^>]*>(.*?)</td>", tables[0])[3:6] == ["wise", "0.480", "-0.020 [-0.050, +0.010]"]
    assert re.findall(r"<td[^>]*>(.*?)</td>", tables[1]) == ["512", "0.25"]
    assert re.findall(r'<img alt="([^"]*)" src="([^"]*)"', page) == [
        ("ΔF1 by condition", "figures/delta_f1_by_condition.png"),
        ("density vs context", "figures/context_scaling.png")]
    assert re.findall(r"<h2>(.*?)</h2>", page) == ["Table 1 — controls", "Context scaling"]
    assert "<em>paper</em>" in page and "<strong>0</strong>" in page
    assert "<code>wise.analysis.calibration</code>" in page


def test_html_embeds_every_figure_so_the_page_is_self_contained(tmp_path):
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(40))
    for name in ("delta_f1_by_condition", "context_scaling"):
        (tmp_path / "figures").mkdir(exist_ok=True)
        (tmp_path / "figures" / f"{name}.png").write_bytes(png + name.encode())
    page = _Page()
    page.feed(markdown_to_html(MD, base=tmp_path))
    assert [base64.b64decode(src.removeprefix("data:image/png;base64,")) for src in page.images] == [
        png + b"delta_f1_by_condition", png + b"context_scaling"]
    (tmp_path / "figures" / "context_scaling.png").unlink()
    with pytest.raises(FileNotFoundError, match="figures/context_scaling.png"):
        markdown_to_html(MD, base=tmp_path)


class _Page(HTMLParser):
    """The page's stylesheet text and image sources."""

    def __init__(self):
        super().__init__()
        self.style, self.images, self._in_style = "", [], False

    def handle_starttag(self, tag, attrs):
        self._in_style = tag == "style"
        if tag == "img":
            self.images.append(dict(attrs)["src"])

    def handle_endtag(self, tag):
        self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.style += data


def test_html_has_the_stylesheet_and_right_aligns_numbers():
    page = _Page()
    page.feed(markdown_to_html(MD))
    rules = dict(re.findall(r"([^{}]+)\{([^}]*)\}", page.style.replace("\n", "")))
    assert "width:100%" in rules["img"] and "max-width:100%" in rules["img"]  # figures at full width
    assert "border" in rules["th,td"] and "padding" in rules["th,td"]
    assert "background" in rules["tbody tr:nth-child(even)"]  # zebra rows
    assert "text-align:right" in rules["td.num"]
    cells = re.findall(r"<td( class=\"num\")?>(.*?)</td>", markdown_to_html(MD))
    assert [(c, bool(num)) for num, c in cells][:6] == [
        ("full", False), ("0.500", True), ("+0.000 [+0.000, +0.000]", True),
        ("wise", False), ("0.480", True), ("-0.020 [-0.050, +0.010]", True)]


def test_a_measurement_with_no_rows_is_a_sentence_not_an_empty_figure(tmp_path, monkeypatch):
    """Kernel timing skipped (no CUDA), no sweeps, no traces for the working set, no context rows:
    the report's HTML has no <img> of those figures (and the PNGs an earlier run left are gone),
    one sentence each in their place; the figures with rows are drawn and embedded."""
    from pipelines.reports.report import write_report

    monkeypatch.chdir(tmp_path)
    p = load_params(ROOT / "params.yaml")
    p = dataclasses.replace(p, statistics=dataclasses.replace(p.statistics, bootstrap_resamples=100))
    stale = tmp_path / "data/report/figures"
    stale.mkdir(parents=True)
    for name in ("speedup_vs_context", "block_size_tradeoff", "rolling_jaccard", "density_vs_context"):
        (stale / f"{name}.png").write_bytes(b"an earlier run's figure")
    timing = [{"source": "random", "status": "skipped: no CUDA", "label": "random_16", "n": 512, "block_size": 16}]
    fractions = [{"scope": "all", "quantity": q, "step": t, "fraction_converged": t / 4}
                 for q in "SAHO" for t in range(1, 5)]
    d = {"summary": _summary(p, "synthchain"), "timing": timing, "convergence": [], "fractions": fractions,
         "stability": {}, "jaccard_mean": [], "sweeps": [], "scaling": [], "calibration": None, "adaptive": None,
         "recurtrace_calibrated": None}
    write_report(p, d, family="wise-chain")
    html_text = (tmp_path / "data/report/report.html").read_text()
    page = _Page()
    page.feed(html_text)
    assert page.style and "img{" in page.style
    drawn = ["figures/delta_f1_by_condition.png", "figures/fraction_converged.png"]
    assert "](figures/delta_f1_by_condition.png)" in (tmp_path / "data/report/report.md").read_text()
    # the page embeds exactly the drawn PNGs (data URIs, in page order), so it is one self-contained file
    md_order = sorted(drawn, key=(tmp_path / "data/report/report.md").read_text().index)
    assert page.images == ["data:image/png;base64," + base64.b64encode((tmp_path / "data/report" / src).read_bytes())
                           .decode() for src in md_order]
    for src in drawn:
        assert (tmp_path / "data/report" / src).stat().st_size > 1000  # a drawn PNG
    assert sorted(x.name for x in stale.iterdir()) == ["delta_f1_by_condition.png", "fraction_converged.png"]
    assert "Kernel timing did not run (skipped: no CUDA)" in html_text
    for sentence in ("No block-size figure", "No stability figure", "No context-scaling figure"):
        assert html_text.count(sentence) == 1, sentence
