"""Studies of the performance model and the plan's decisions against measurement."""
