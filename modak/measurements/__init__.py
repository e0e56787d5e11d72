"""The perf store: measured rows (SQLite, CSV), the data layer under prediction."""
