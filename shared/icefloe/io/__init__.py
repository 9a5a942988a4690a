"""Storage: one async FileIO over the local file system and S3, addressed by URI, and the
normal form of locations every containment check uses. Imports nothing of Iceberg."""
