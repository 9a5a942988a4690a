"""A table behind the catalog interface, and every change to it: the catalog protocol
(catalog), optimistic commits with retry (commit), the exactly-once commit index and
dedup ledger, the REST updates and requirements, snapshot operations
(snapshot_producer), keyed tables, maintenance and its policy, health and compaction
planning. The catalogs that implement the protocol are ``icefloe.catalog``, above this."""
