"""Hardware: the target's ceilings (peaks, bandwidth, compiler flags) and the probe that measures them."""
