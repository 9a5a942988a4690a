"""The catalogs: the spec's file-system tables (fs), Redis (redis) and DynamoDB (dynamodb)
metastores, the records and the table-location index they keep, and opening one from
a URI (uri). The interface they implement is ``icefloe.table.catalog``: it sits below
the table operations, which a catalog's purge uses."""
