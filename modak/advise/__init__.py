"""Advice beyond one plan: what-if across targets (:mod:`modak.advise.whatif`), co-location (:mod:`modak.advise.pack`)."""
