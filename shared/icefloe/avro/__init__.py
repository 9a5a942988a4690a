"""Avro, as Iceberg uses it for manifests and manifest lists: schemas with field ids,
value encoding and container files (codec), and whole files decoded into Arrow (arrow)."""
