"""Memory reports: the PDF (Qt's own writer), and the same content as HTML and JSON."""

from .exports import build_report, export_html, export_json, report_json
from .pdf import PAGE_SIZES, ensure_gui_application

__all__ = ["build_report", "export_html", "export_json", "report_json", "ensure_gui_application", "PAGE_SIZES"]
