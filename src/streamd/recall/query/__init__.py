"""Answering a search within one generation, as the reference does.

* :mod:`~streamd.recall.query.rank` - which records match and in what order.
* :mod:`~streamd.recall.query.relevance` - the relevance number per hit.
* :mod:`~streamd.recall.query.variants` - number variants (plural, singular).
* :mod:`~streamd.recall.query.render` - excerpts, expansions, watermarks.
"""
