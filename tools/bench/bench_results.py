"""The layout of the bench's results (results.json), read by both the report (bench_report) and the plot
(bench_plot), so that neither imports the other's module for it."""
from __future__ import annotations


def per_steps(results: dict) -> dict:
    """The measured model's results by step count (stored under the model's name: "digits" or "video")."""
    return results[results["meta"].get("model", "digits")]
