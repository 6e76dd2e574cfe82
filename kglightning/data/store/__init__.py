"""Where the data layer keeps what it computed: the record store (validated records as Arrow files), the embedding
shards and their float16 row table, the cached ``datasets`` map steps of per-question stages, the cache folders and
their administration (``kglightning cache``), and the release of memory-mapped pages.

These are the machinery under :mod:`kglightning.data`'s schema, loaders and KG index; users reach them through
:func:`~kglightning.data.read_records`, :class:`~kglightning.data.EmbeddingCache` and the ``kglightning cache``
command rather than directly.
"""
