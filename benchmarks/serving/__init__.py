"""Load on the serving runtime (modak serve)."""
