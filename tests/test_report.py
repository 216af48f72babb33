"""The report's HTML page: the markdown report rendered by Python-Markdown (tables extension)."""
import re

from pipelines.report import markdown_to_html, table

MD = "\n".join([
    "# WISE report", "",
    "Columns marked *paper* are Huginn's; rows that differ: **0** of 12 (`wise.calibration`).", "",
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
    assert re.findall(r"<td>(.*?)</td>", tables[0])[3:6] == ["wise", "0.480", "-0.020 [-0.050, +0.010]"]
    assert re.findall(r"<td>(.*?)</td>", tables[1]) == ["512", "0.25"]
    assert re.findall(r'<img alt="([^"]*)" src="([^"]*)"', page) == [
        ("ΔF1 by condition", "figures/delta_f1_by_condition.png"),
        ("density vs context", "figures/context_scaling.png")]
    assert re.findall(r"<h2>(.*?)</h2>", page) == ["Table 1 — controls", "Context scaling"]
    assert "<em>paper</em>" in page and "<strong>0</strong>" in page
    assert "<code>wise.calibration</code>" in page
