"""Advice across plans: what-if over targets (:mod:`modak.advise.whatif`) and co-location (:mod:`modak.advise.pack`),
both predicting shared nodes and GPUs with the sharing model (:mod:`modak.advise.contention`). Data-parallel scaling
of one plan is :mod:`modak.scaling`, below rendering, which requests the workers it picks."""
