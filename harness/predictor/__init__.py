"""The eviction-prediction article's learned attention predictor: key features dumped by ``lmc``,
gradient-boosted trees per layer (scikit-learn's HistGradientBoostingRegressor), the article's
ranking metrics, and the tree file ``lmc --attn gbm --predictor FILE`` evaluates.

- :mod:`harness.predictor.dump` runs ``lmc ppl --dump-features`` and reads the rows back;
- :mod:`harness.predictor.metrics` scores a ranking of keys against the true attention mass;
- :mod:`harness.predictor.train` trains the feature sets, evaluates them beside the baselines
  and writes the tree file.
"""
