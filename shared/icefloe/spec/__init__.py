"""The Iceberg table format as data: types and values, schemas and their evolution,
transforms, partition specs, sort orders, snapshots, data files and table metadata
with the builder every change goes through (the spec's sections and appendices).
Pure: no I/O, no catalog."""
