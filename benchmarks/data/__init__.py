"""Measurement campaigns and data collection: the rows under perfmodels/ and studies of their noise."""
