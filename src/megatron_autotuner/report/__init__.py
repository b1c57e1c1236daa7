"""Reports on disk: JSON, text summaries and charts. matplotlib is imported lazily."""

from .plan_report import output_dir_for, plot_plan, write_plan_report

__all__ = ["output_dir_for", "plot_plan", "write_plan_report"]
