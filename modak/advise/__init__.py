"""Advice beyond one machine: what modak predicts for a job run differently from its plan."""
