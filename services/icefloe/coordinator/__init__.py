"""The commit coordinator service: one Kafka consumer group committing to Iceberg tables."""
