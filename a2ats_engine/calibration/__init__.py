"""Codebook calibration: the corpus, batched k-means and the query-aware fit."""
