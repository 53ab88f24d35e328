"""What the user sees of a run: the live text and the summary (report.py) and the tuning plot (plot.py)."""
