"""Manifests and manifest lists: reading and writing their Avro, decoding them into Arrow
columns, caching them in memory and on disk, pruning their entries, and the entry
queries a commit asks of them."""
