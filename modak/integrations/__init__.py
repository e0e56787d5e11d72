"""modak in other people's pipelines.

* :mod:`modak.integrations.check`: ``modak check``, a CI gate that fails when a job's predicted (or measured)
  step time regresses against a stored baseline.
* ``integrations/`` (shipped as package data, see :func:`modak.paths.data_dir` ``("integrations")``): the
  GitHub Action's step script, the GitLab CI template and the TOSCA (xOpera) node types and playbooks.
"""
