"""The scan planner service (Iceberg REST scan planning) and its REST write routes."""
