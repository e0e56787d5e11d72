"""Tooling checks (fuzzing, plan speed, build cache, overhead priors) and helpers the other scripts share."""
