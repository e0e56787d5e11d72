"""Checks of modak's models against published figures (perfmodels/published/)."""
