"""Parts that veRL keeps under ``verl.experimental`` (import paths kept for carried-over code)."""
