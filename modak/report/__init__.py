"""``modak report``: a self-contained HTML report of a plan (roofline plots, ranked table, reasons)."""

from modak.report.html import render_report, write_report

__all__ = ["render_report", "write_report"]
